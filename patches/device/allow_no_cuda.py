"""Let Megatron initialise without CUDA on the NPU and CPU backends.

Upstream: ``megatron.training.initialize.initialize_megatron`` starts with
``assert torch.cuda.is_available(), "Megatron requires CUDA."`` unless called
with ``allow_no_cuda=True``; ``pretrain()`` never passes it. The assertion
guards a GPU-only assumption that the device features of this adaptor remove,
so on ``npu`` and ``cpu`` we pass ``allow_no_cuda=True``. On ``cuda`` nothing
changes.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__


def _allow_no_cuda(wrapped, instance, call_args, kwargs):
    kwargs["allow_no_cuda"] = True
    return wrapped(*call_args, **kwargs)


class AllowNoCuda(Feature):
    name = "allow_no_cuda"
    backends = ("npu", "cpu")

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.initialize.initialize_megatron", _allow_no_cuda, OWNER)
