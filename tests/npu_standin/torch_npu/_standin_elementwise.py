"""STAND-IN torch_npu fused operators (elementwise): check each call's arguments, return CPU reference results.

Signatures and argument limits follow torch_npu's documentation:
``npu_rms_norm(x, gamma, epsilon=1e-6) -> (y, rstd)``,
``npu_swiglu(x, dim=-1)``, ``npu_rotary_mul(x, r1, r2, rotary_mode='half')``.
Results are plain torch, so autograd gives the reference gradients.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["npu_rms_norm", "npu_swiglu", "npu_rotary_mul"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _record(name, args, kwargs):
    import torch_npu

    torch_npu.calls.append((name, args, kwargs))


def _require(cond, message):
    if not cond:
        raise RuntimeError(f"torch_npu stand-in: {message}")


def npu_rms_norm(x, gamma, epsilon=1e-6):
    _record("npu_rms_norm", (x, gamma), {"epsilon": epsilon})
    _require(isinstance(x, torch.Tensor) and x.dtype in _FLOATS, f"x must be a float tensor, got {type(x)}")
    _require(isinstance(gamma, torch.Tensor) and gamma.dim() >= 1, "gamma must be a tensor of >= 1 dims")
    _require(tuple(x.shape[-gamma.dim():]) == tuple(gamma.shape),
             f"gamma {tuple(gamma.shape)} must match the last dims of x {tuple(x.shape)}")
    _require(gamma.dtype in (x.dtype, torch.float32), f"gamma dtype {gamma.dtype} vs x {x.dtype}")
    _require(isinstance(epsilon, float) and epsilon > 0, f"epsilon must be a positive float, got {epsilon!r}")
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon)
    return (xf * rstd).to(x.dtype) * gamma, rstd


def npu_swiglu(x, dim=-1):
    _record("npu_swiglu", (x,), {"dim": dim})
    _require(isinstance(x, torch.Tensor) and x.dtype in _FLOATS, "x must be a float tensor")
    _require(isinstance(dim, int) and -x.dim() <= dim < x.dim(), f"dim {dim!r} out of range for {x.dim()}-D x")
    _require(x.shape[dim] % 2 == 0, f"x.shape[{dim}]={x.shape[dim]} must be even")
    a, b = x.chunk(2, dim)
    return F.silu(a) * b


def npu_rotary_mul(x, r1, r2, rotary_mode="half"):
    _record("npu_rotary_mul", (x, r1, r2), {"rotary_mode": rotary_mode})
    _require(rotary_mode in ("half", "interleave"), f"rotary_mode {rotary_mode!r}")
    for name, t in (("x", x), ("r1", r1), ("r2", r2)):
        _require(isinstance(t, torch.Tensor) and t.dim() == 4, f"{name} must be a 4-D tensor")
        _require(t.dtype == x.dtype and t.dtype in _FLOATS, f"{name} dtype {t.dtype} vs x {x.dtype}")
    _require(r1.shape == r2.shape, f"r1 {tuple(r1.shape)} and r2 {tuple(r2.shape)} differ")
    d = x.shape[-1]
    _require(d % 2 == 0 and d < 896, f"D={d} must be even and < 896")
    _require(r1.shape[-1] == d, f"r1/r2 last dim {r1.shape[-1]} must equal D={d}")
    _require(all(r in (1, n) for r, n in zip(r1.shape[:3], x.shape[:3])),
             f"r1/r2 {tuple(r1.shape)} do not broadcast to x {tuple(x.shape)}")
    # One of x's first three dims is the sequence (BNSD / BSND / SBND); r1 must span it.
    _require(any(r == n for r, n in zip(r1.shape[:3], x.shape[:3])) or max(x.shape[:3]) == 1,
             f"r1/r2 {tuple(r1.shape)} carry no sequence dimension of x {tuple(x.shape)}")
    if rotary_mode == "half":
        x1, x2 = x.chunk(2, -1)
        rotated = torch.cat((-x2, x1), dim=-1)
    else:
        rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    return x * r1 + rotated * r2
