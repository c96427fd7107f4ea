"""Gradient clipping that checks dtypes, not CUDA tensor type names.

Upstream: ``megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32``
asserts ``param.grad.type() == 'torch.cuda.FloatTensor'`` — a string that is
``'torch.FloatTensor'`` on CPU and ``'torch.npu.FloatTensor'`` on Ascend, so
every optimizer step with ``--clip-grad`` fails there. The replacement keeps
the contract (fp32 main grads, scaled in place by ``max_norm / total_norm``
when that is below one) and checks the dtype instead; the scaling is the same
elementwise multiply, so results are identical.

Remove when: ``clip_grad_by_total_norm_fp32`` checks the gradient's dtype instead of
``param.grad.type() == 'torch.cuda.FloatTensor'``. Not fixed upstream as of megatron-core 0.19.2
(clip_grads.py line 174) nor on Megatron-LM main (d98e8a64, 2026-08-22); no upstream issue or PR
found.
"""
from __future__ import annotations

from typing import List, Union

import torch

from adaptor.features import Feature

OWNER = __name__


def clip_grad_by_total_norm_fp32(
    parameters: Union[List[torch.Tensor], torch.Tensor],
    max_norm: Union[int, float],
    total_norm: Union[float, torch.Tensor],
    use_decoupled_grad: bool = False,
) -> None:
    from megatron.core.utils import to_local_if_dtensor

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    allowed = (torch.float32, torch.bfloat16) if use_decoupled_grad else (torch.float32,)
    grads = []
    for param in parameters:
        grad = getattr(param, "decoupled_grad", None) if use_decoupled_grad else param.grad
        if grad is None:
            continue
        if grad.dtype not in allowed:
            raise TypeError(f"gradient clipping expects {allowed} main grads, got {grad.dtype}")
        grads.append(to_local_if_dtensor(grad).detach())
    if not grads:
        return
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if isinstance(clip_coeff, torch.Tensor):
        torch._foreach_mul_(grads, clip_coeff.clamp_max(1.0))
    elif clip_coeff < 1.0:
        torch._foreach_mul_(grads, clip_coeff)


class DeviceAgnosticClipGrads(Feature):
    name = "device_agnostic_clip_grads"
    backends = ("npu", "cpu")

    def register_patches(self, pm, ctx) -> None:
        pm.register_replacement(
            "megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32", clip_grad_by_total_norm_fp32, OWNER
        )
