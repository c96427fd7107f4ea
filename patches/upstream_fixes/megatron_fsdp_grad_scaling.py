"""Megatron-FSDP's per-token gradient scaling keeps the tensor-parallel sums of replicated weights.

Upstream: ``megatron.core.distributed.finalize_model_grads.finalize_model_grads`` first all-reduces over
the tensor-parallel group the gradients of the weights every TP rank holds whole (the norms under
``--sequence-parallel``, q/k layernorms), in the gradients attached to the optimizer's parameters; then,
for ``--calculate-per-token-loss``, calls ``scale_gradients`` (``megatron.core.distributed.fsdp.src.
megatron_fsdp.param_and_grad_buffer.ParamAndGradBuffer.scale_gradients``), which scales Megatron-FSDP's
main-gradient buffer and re-attaches the optimizer gradients from it. Under ``--bf16``/``--fp16`` with
fp32 main weights those gradients are casted copies of the buffer, so re-attaching throws the
all-reduced sums away: each TP rank steps its replicated weights with its own partial gradient, the
replicas drift apart, and a resumed run (which loads one replica) leaves the curve (5e-5 after one
step at TP=2+SP). The wrapper scales the buffer as upstream does and then scales, in place, every
attached gradient that is a copy rather than a view of the buffer (views were scaled with it), so the
sums stay. In fp32 the gradients are views and the result is upstream's.

Remove when: ``scale_gradients`` scales the attached gradients instead of re-attaching them, or
``finalize_model_grads`` scales before the tensor-parallel all-reduce. Neither in megatron-core 0.19.2.
"""
from __future__ import annotations

import torch

from adaptor.features import Feature

OWNER = __name__
TARGET = ("megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer."
          "ParamAndGradBuffer.scale_gradients")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if hasattr(tensor, "_local_tensor") else tensor


def _scale_attached_gradients(wrapped, instance, call_args, kwargs):
    factor = kwargs["scaling_factor"] if "scaling_factor" in kwargs else call_args[0]
    attached = [(param, _local(getattr(param, "decoupled_grad", None) if instance.use_decoupled_grad else param.grad))
                for _, param in instance.optimizer_named_parameters]
    attached = [(param, grad) for param, grad in attached if grad is not None and grad.numel()]
    if not attached:  # nothing attached yet: upstream attaches them, scaled
        return wrapped(*call_args, **kwargs)
    buffers = set()
    for group in instance.parameter_groups:
        if group.main_grad_buffer is not None:
            group.main_grad_buffer.data *= factor
            buffers.add(group.main_grad_buffer.data.untyped_storage().data_ptr())
    for _, grad in attached:
        if grad.untyped_storage().data_ptr() not in buffers:
            grad.mul_(factor)
    return None


class MegatronFsdpGradScaling(Feature):
    name = "megatron_fsdp_grad_scaling"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(TARGET, _scale_attached_gradients, OWNER)
