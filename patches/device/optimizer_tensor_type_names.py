"""Let Megatron's optimizers accept CPU and NPU parameters.

Upstream: ``megatron.core.optimizer.optimizer.Float16OptimizerWithFloat16Params.__init__``
(``--bf16``/``--fp16``) and
``megatron.core.optimizer.distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups``
compare ``param.type()`` with ``'torch.cuda.*Tensor'`` names and reject CPU and NPU parameters,
though the rest is device-agnostic. Rather than fork those long methods, while one runs the
no-argument ``Tensor.type()`` reports a CPU or NPU tensor under its dtype's CUDA name.

Remove when: ``Float16OptimizerWithFloat16Params.__init__`` and
``DistributedOptimizer._build_model_and_main_param_groups`` sort parameters by dtype instead of
comparing ``Tensor.type()`` with CUDA type names. Not fixed upstream as of megatron-core 0.19.2
(optimizer.py lines 1009-1037, distrib_optimizer.py lines 401-481) nor on Megatron-LM main
(d98e8a64, 2026-08-22); no upstream issue or PR found.
"""
from __future__ import annotations

import threading

from adaptor.features import Feature

OWNER = __name__
_active = threading.local()

SCOPED = (
    "megatron.core.optimizer.optimizer.Float16OptimizerWithFloat16Params.__init__",
    "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups",
)


def _type_name(wrapped, instance, call_args, kwargs):
    name = wrapped(*call_args, **kwargs)
    if call_args or kwargs or not getattr(_active, "depth", 0) or not isinstance(name, str):
        return name
    if name.startswith("torch.npu."):
        return "torch.cuda." + name[len("torch.npu."):]
    if name.startswith("torch.") and name.count(".") == 1:  # CPU: torch.FloatTensor
        return "torch.cuda." + name[len("torch."):]
    return name


def _with_cuda_type_names(wrapped, instance, call_args, kwargs):
    _active.depth = getattr(_active, "depth", 0) + 1
    try:
        return wrapped(*call_args, **kwargs)
    finally:
        _active.depth -= 1


class OptimizerTensorTypeNames(Feature):
    name = "optimizer_tensor_type_names"
    backends = ("npu", "cpu")

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("torch.Tensor.type", _type_name, OWNER)
        for target in SCOPED:
            pm.register_wrapper(target, _with_cuda_type_names, OWNER)
