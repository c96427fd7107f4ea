"""``--sequence-parallel`` on the local spec: torch LayerNorm/RMSNorm that mark their parameters.

Upstream: ``megatron.core.transformer.torch_norm.WrappedTorchNorm.__new__`` (the local spec's norm
without apex, as on NPU and CPU) asserts "sequence parallel not supported by torch LayerNorm", and
``MoELayer.forward`` needs sequence parallelism with TP, so MoE models could not use TP without TE
or apex. A sequence-parallel norm only needs its parameters marked ``sequence_parallel=True`` so
Megatron all-reduces their partial gradients over TP
(``finalize_model_grads._allreduce_non_tensor_model_parallel_grads``), as apex and TE declare; the
wrapper builds the torch norm with the assert skipped and marks them.

Remove when: ``WrappedTorchNorm`` accepts ``sequence_parallel`` and marks its parameters
``sequence_parallel=True``, as TE's norms do. Not fixed upstream as of megatron-core 0.19.2
(torch_norm.py line 50) nor on Megatron-LM main (d98e8a64, 2026-08-22); asked in
https://github.com/NVIDIA/Megatron-LM/issues/1448 (open).
"""
from __future__ import annotations

from adaptor.features import Feature
from adaptor.wrapping import overridden, transformer_config

OWNER = __name__


def _torch_norm_new(wrapped, instance, call_args, kwargs):
    config = transformer_config(call_args, kwargs)
    if not config.sequence_parallel:
        return wrapped(*call_args, **kwargs)
    with overridden(config, sequence_parallel=False):  # hide it from the assert only
        norm = wrapped(*call_args, **kwargs)
    for param in norm.parameters():
        setattr(param, "sequence_parallel", True)
    return norm


class SequenceParallelTorchNorm(Feature):
    name = "sequence_parallel_torch_norm"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.core.transformer.torch_norm.WrappedTorchNorm.__new__", _torch_norm_new, OWNER)
