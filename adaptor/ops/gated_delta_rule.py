"""Torch counterparts of the three flash-linear-attention (fla) kernels Gated DeltaNet calls.

megatron-core's ``megatron.core.ssm.gated_delta_net`` imports ``causal_conv1d``, ``l2norm`` and
``chunk_gated_delta_rule`` from fla, a Triton package that runs on CUDA only. These functions take
the same arguments, in the same layouts, and return the same values, in plain torch, so they run on
any device (CPU, NPU, CUDA without fla):

* :func:`causal_conv1d`: ``(x [B, T, D], weight [D, W], bias, activation, initial_state,
  output_final_state, cu_seqlens) -> (y, final_state)``, a depthwise convolution over time that sees
  only the current and the ``W - 1`` previous steps (left zero padding), then the activation
  (``silu``/``swish``, or none); with ``cu_seqlens`` (``B == 1``) each packed sequence starts afresh.
* :func:`l2norm`: ``x * rsqrt(sum(x**2, dim) + eps)`` over the last dimension, fla's formula
  (eps inside the root, 1e-6), not ``F.normalize``'s ``x / max(||x||, eps)``.
* :func:`chunk_gated_delta_rule`: ``(q, k [B, T, H, K], v [B, T, H, V], g, beta [B, T, H], scale,
  initial_state [N, H, K, V], output_final_state, use_qk_l2norm_in_kernel, cu_seqlens) -> (o [B, T,
  H, V], final_state [N, H, K, V] or None)``. ``g`` is the log of the per-step decay; ``scale``
  multiplies the queries (default ``K ** -0.5``). The state ``S`` (stored ``[K, V]``, i.e. the
  transpose of the matrix below) follows ``S_t = g_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t
  k_t^T`` and ``o_t = S_t (scale q_t)``. The chunked computation is megatron-core's own
  ``torch_chunk_gated_delta_rule`` (what ``--deterministic-mode`` runs); this wrapper adds the
  ``scale`` and ``cu_seqlens`` arguments it lacks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_ACTIVATIONS = {None: None, "silu": F.silu, "swish": F.silu}


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6, output_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x`` scaled to unit L2 norm along ``dim`` (fla's ``x * rsqrt(sum(x^2) + eps)``), computed in fp32."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).sum(dim=dim, keepdim=True) + eps)
    return y.to(output_dtype or x.dtype)


def _segments(cu_seqlens, total: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, total)]
    bounds = [int(b) for b in cu_seqlens.tolist()]
    if bounds[0] != 0 or bounds[-1] != total:
        raise ValueError(f"cu_seqlens {bounds} does not cover the {total} packed tokens")
    return list(zip(bounds[:-1], bounds[1:]))


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    activation: str | None = None,
    cu_seqlens: torch.Tensor | None = None,
    **_unused,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal depthwise conv1d over time of ``x`` ``[B, T, D]`` with ``weight`` ``[D, W]``, then ``activation``.

    ``initial_state`` ``[N, D, W]`` holds the inputs before the first step (fla's layout; its last
    ``W - 1`` columns are used); the final state returned is the same window at the end. ``residual``
    is added after the activation, as fla adds it.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"causal_conv1d: activation {activation!r} is not one of silu, swish or None")
    act = _ACTIVATIONS[activation]
    batch, total, dim = x.shape
    width = weight.shape[-1]
    segments = _segments(cu_seqlens, total)
    if cu_seqlens is not None and batch != 1:
        raise ValueError(f"causal_conv1d: packed sequences (cu_seqlens) need batch 1, got {batch}")
    outputs, finals = [], []
    for n, (start, end) in enumerate(segments):
        seq = x[:, start:end].transpose(1, 2)  # [B, D, T]
        if initial_state is not None:
            state = initial_state[n:n + 1] if cu_seqlens is not None else initial_state
            history = state[..., state.shape[-1] - (width - 1):].to(seq.dtype)
        else:
            history = seq.new_zeros(seq.shape[0], dim, width - 1)
        padded = torch.cat([history, seq], dim=-1)
        y = F.conv1d(padded, weight.unsqueeze(1).to(seq.dtype), bias, groups=dim)
        if act is not None:
            y = act(y)
        outputs.append(y.transpose(1, 2).contiguous())  # fla returns [B, T, D] contiguous
        if output_final_state:
            window = padded[..., padded.shape[-1] - width:] if padded.shape[-1] >= width else F.pad(
                padded, (width - padded.shape[-1], 0))
            finals.append(window)
    y = torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]
    if residual is not None:
        y = y + residual
    final = torch.cat(finals, dim=0) if output_final_state else None
    return y, final


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
    **_unused,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's ``chunk_gated_delta_rule`` through megatron-core's torch chunked implementation."""
    from megatron.core.ssm.gated_delta_net.common import torch_chunk_gated_delta_rule

    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    head_dim = q.shape[-1]
    if scale is not None and scale != head_dim ** -0.5:
        q = q * (scale * head_dim ** 0.5)  # the torch rule scales by K ** -0.5 itself
    if cu_seqlens is None:
        return torch_chunk_gated_delta_rule(
            q, k, v, g, beta, chunk_size=chunk_size, initial_state=initial_state,
            output_final_state=output_final_state)
    if q.shape[0] != 1:
        raise ValueError(f"chunk_gated_delta_rule: packed sequences (cu_seqlens) need batch 1, got {q.shape[0]}")
    outputs, finals = [], []
    for n, (start, end) in enumerate(_segments(cu_seqlens, q.shape[1])):
        part = slice(start, end)
        out, final = torch_chunk_gated_delta_rule(
            q[:, part], k[:, part], v[:, part], g[:, part], beta[:, part], chunk_size=chunk_size,
            initial_state=None if initial_state is None else initial_state[n:n + 1],
            output_final_state=output_final_state)
        outputs.append(out)
        finals.append(final)
    final = torch.cat(finals, dim=0) if output_final_state else None
    return torch.cat(outputs, dim=1), final
