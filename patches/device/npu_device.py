"""NPU backend: Megatron's CUDA calls go to torch_npu, as torch_npu's transfer_to_npu does.

Upstream: megatron-core and megatron.training address the accelerator as ``torch.cuda.*`` and
``device='cuda'``; torch_npu offers the same API as ``torch.npu.*``. On the ``npu`` backend only:
the ``torch.cuda`` functions Megatron uses point at ``torch.npu``; CUDA device arguments (factories,
``.to()``, ``.cuda()``) become ``npu``; the TP RNG tracker's ``_get/_set_cuda_rng_state`` use
``torch.npu``; ``backend='nccl'`` becomes ``hccl``; ``torch.compile``d functions run eagerly
(``torch._dynamo.config.disable``), since Megatron's ``jit_fuser`` is applied at import and inductor
has no Ascend target (``--disable-jit-fuser`` is read too late).

Verified against a stand-in torch_npu (tests/npu_standin), not on Ascend hardware.
"""
from __future__ import annotations

import torch

from adaptor.features import Feature
from adaptor.device_redirect import CUDA_NAMES, make_mapper, register_collective_backend, register_device_arguments

OWNER = __name__

def _npu():
    return torch.npu  # set by `import torch_npu`


def _tensor_cuda(self, device=None, non_blocking=False, **kwargs):
    return self.npu(make_mapper("npu")(device) if device is not None else None, non_blocking=non_blocking, **kwargs)


def _module_cuda(self, device=None):
    return self.npu(make_mapper("npu")(device) if device is not None else None)


def _get_rng_state(device="cuda", clone=False, graph_safe=False):
    state = _npu().get_rng_state()
    return state.clone() if clone else state


def _set_rng_state(new_state, device=-1, graph_safe=False):
    _npu().set_rng_state(new_state)


class NpuDevice(Feature):
    name = "npu_device"
    backends = ("npu",)

    def register_patches(self, pm, ctx) -> None:
        npu = _npu()
        for name in CUDA_NAMES:
            if hasattr(npu, name):
                pm.register_replacement(f"torch.cuda.{name}", getattr(npu, name), OWNER)
        register_device_arguments(pm, OWNER, make_mapper("npu"))
        register_collective_backend(pm, OWNER, ctx.backend.dist_backend)
        pm.register_replacement("torch.Tensor.cuda", _tensor_cuda, OWNER)
        pm.register_replacement("torch.nn.Module.cuda", _module_cuda, OWNER)
        pm.register_replacement("megatron.core.tensor_parallel.random._get_cuda_rng_state", _get_rng_state, OWNER)
        pm.register_replacement("megatron.core.tensor_parallel.random._set_cuda_rng_state", _set_rng_state, OWNER)
        pm.register_replacement("torch._dynamo.config.disable", True, OWNER)
