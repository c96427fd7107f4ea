"""Rotary position embedding in one pass, in megatron-core's non-interleaved layout.

``fused_apply_rotary_pos_emb(t, freqs)``: t is [s, b, h, d], freqs [s, 1, 1, r]
(fp32 angles, r <= d; the last d - r channels pass through unchanged, as
``--rotary-percent`` < 1 asks). Result: t * cos + rotate_half(t) * sin, with
cos/sin cast to t's dtype as megatron-core does.

NPU: ``torch_npu.npu_rotary_mul(x, cos, sin)`` on the SBND layout (cos/sin
S11D). CUDA and CPU: an autograd Function writing both halves of the output
directly (no chunk/neg/cat temporaries) and saving only cos/sin; backward is
the transposed rotation. ``fused_apply_rotary_pos_emb_thd`` gathers the
per-token angles of packed sequences exactly as megatron-core's unfused THD
path does, then applies the same kernel.
"""
from __future__ import annotations


import torch

from adaptor import run_state
from adaptor.log import announce_kernel

_KERNEL = {"npu": "torch_npu.npu_rotary_mul", "cuda": "autograd function", "cpu": "autograd function"}


def _halves(x, cos, sin):
    half = x.shape[-1] // 2
    out = torch.empty(torch.broadcast_shapes(x.shape, cos.shape), dtype=x.dtype, device=x.device)
    split = lambda v: (v[..., :half], v[..., half:])  # noqa: E731
    return out, split(x), split(cos), split(sin), split(out)


def _rope_forward(x, cos, sin):
    """[x1 c1 - x2 s1, x2 c2 + x1 s2] = x * cos + rotate_half(x) * sin."""
    out, (x1, x2), (c1, c2), (s1, s2), (o1, o2) = _halves(x, cos, sin)
    torch.mul(x1, c1, out=o1).addcmul_(x2, s1, value=-1)
    torch.mul(x2, c2, out=o2).addcmul_(x1, s2)
    return out


def _rope_backward(g, cos, sin):
    """Transposed rotation: [g1 c1 + g2 s2, g2 c2 - g1 s1]."""
    out, (g1, g2), (c1, c2), (s1, s2), (o1, o2) = _halves(g, cos, sin)
    torch.mul(g1, c1, out=o1).addcmul_(g2, s2)
    torch.mul(g2, c2, out=o2).addcmul_(g1, s1, value=-1)
    return out


class _RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope_forward(t, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rope_backward(grad, cos, sin), None, None


def _apply(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    announce_kernel("fused RoPE", _KERNEL)
    rot_dim = freqs.shape[-1]
    cos = torch.cos(freqs).to(t.dtype)
    sin = torch.sin(freqs).to(t.dtype)
    rot = t if rot_dim == t.shape[-1] else t[..., :rot_dim]
    if run_state.backend().name == "npu":
        import torch_npu

        out = torch_npu.npu_rotary_mul(rot, cos, sin)
    else:
        out = _RopeFunction.apply(rot, cos, sin)
    return out if rot_dim == t.shape[-1] else torch.cat((out, t[..., rot_dim:]), dim=-1)


def fused_apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, transpose_output_memory: bool = False,
                               interleaved: bool = False) -> torch.Tensor:
    """Signature of megatron-core's TE wrapper; ``t`` [s, b, h, d], ``freqs`` [s, 1, 1, r]."""
    if interleaved:
        raise NotImplementedError("--use-fused-rotary-pos-emb supports the non-interleaved layout only")
    return _apply(t, freqs)


def thd_freqs(cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int, cp_rank: int, local_lengths) -> torch.Tensor:
    """Per-token angles [t, 1, 1, r] for packed sequences on this CP rank, as upstream selects them."""
    from megatron.core.models.common.embeddings.rope_utils import _get_thd_freqs_on_this_cp_rank

    packed = freqs.size(0) == int(cu_seqlens[-1].item())  # angles given per packed token
    parts = []
    for i, n in enumerate(local_lengths):
        offset = int(cu_seqlens[i].item()) if packed else 0
        parts.append(_get_thd_freqs_on_this_cp_rank(cp_rank, cp_size, torch.empty(n), freqs, offset))
    return torch.cat(parts, dim=0)


def fused_apply_rotary_pos_emb_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1,
                                   cp_rank: int = 0, interleaved: bool = False) -> torch.Tensor:
    """Packed sequences: ``t`` [t, h, d], ``cu_seqlens`` [b + 1] over the full (pre-CP) lengths."""
    if interleaved:
        raise NotImplementedError("--use-fused-rotary-pos-emb supports the non-interleaved layout only")
    lengths = ((cu_seqlens[1:] - cu_seqlens[:-1]) // cp_size).tolist()
    local = thd_freqs(cu_seqlens, freqs, cp_size, cp_rank, lengths)
    return _apply(t.unsqueeze(1), local).squeeze(1)
