"""SwiGLU (silu(a) * b over the two halves of the last dimension) in one pass.

NPU: ``torch_npu.npu_swiglu(x, dim=-1)`` (its own backward). CUDA and CPU: an
autograd Function that keeps only the input and recomputes the sigmoid in
backward, where autograd over ``silu(a) * b`` keeps a, b and silu(a).
Signatures match megatron-core's ``bias_swiglu_impl`` and
``weighted_bias_swiglu_impl``, which ``patches/fusions/swiglu.py`` replaces.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from adaptor import run_state
from adaptor.log import announce_kernel

_KERNEL = {"npu": "torch_npu.npu_swiglu", "cuda": "autograd function", "cpu": "autograd function"}


def _forward(x):
    a, b = x.chunk(2, -1)
    return F.silu(a) * b


def _backward(grad, x):
    a, b = x.chunk(2, -1)
    dx = torch.empty_like(x)
    da, db = dx.chunk(2, -1)
    torch.mul(grad, F.silu(a), out=db)
    torch.ops.aten.silu_backward.grad_input(grad * b, a, grad_input=da)  # one kernel for d silu
    return dx


class _SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _forward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _backward(grad, x)


class _WeightedSwiGLUFunction(torch.autograd.Function):
    """swiglu(x) * w with per-token weights w [N, 1]; result in x's dtype, as upstream."""

    @staticmethod
    def forward(ctx, x, weights):
        ctx.save_for_backward(x, weights)
        return (_forward(x) * weights).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weights = ctx.saved_tensors
        dx = _backward(grad * weights, x).to(x.dtype)
        dw = (_forward(x) * grad.to(weights.dtype)).sum(-1, keepdim=True).to(weights.dtype)
        return dx, dw


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :n]) * x[..., n:] with the kernel for the backend in use."""
    if run_state.backend().name == "npu":
        import torch_npu

        return torch_npu.npu_swiglu(x, dim=-1)
    return _SwiGLUFunction.apply(x)


def _check(x, fp8_input_store):
    if fp8_input_store:
        raise NotImplementedError("--use-fused-swiglu does not store activations in fp8")
    assert x.dim() in (2, 3), f"SwiGLU input must be 2-D or 3-D, got {tuple(x.shape)}"


def bias_swiglu_impl(input, bias, fp8_input_store=False, cpu_offload_input=False):
    """Megatron's ``bias_swiglu_impl``: swiglu(input + bias), bias optional."""
    _check(input, fp8_input_store)
    announce_kernel("fused SwiGLU", _KERNEL)
    if bias is not None:
        input = input + bias
    return swiglu(input)


def weighted_bias_swiglu_impl(input, bias, weights, fp8_input_store=False):
    """Megatron's ``weighted_bias_swiglu_impl``: swiglu(input) * weights per token (no bias)."""
    _check(input, fp8_input_store)
    announce_kernel("fused SwiGLU", _KERNEL)
    if bias is not None:
        raise NotImplementedError("Bias is not supported for weighted swiglu fusion")
    shape = input.shape
    x = input.reshape(-1, shape[-1])
    if run_state.backend().name == "npu":
        out = (swiglu(x) * weights).to(input.dtype)
    else:
        out = _WeightedSwiGLUFunction.apply(x, weights)
    return out.view(*shape[:-1], -1)
