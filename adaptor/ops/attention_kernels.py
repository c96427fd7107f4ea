"""Attention of one block of queries on one block of keys, with its log-sum-exp, forward and backward.

Context parallelism merges pieces by their log-sum-exp (lse); a piece's backward is the flash
backward run with the *merged* output and lse, so the pieces' gradients sum to the full one:

* ``forward(q, k, v, causal, scale, cu_q, cu_k) -> (out, lse)``
* ``backward(dout, q, k, v, out, lse, causal, scale, cu_q, cu_k) -> (dq, dk, dv)``

Tensors are [b, heads, s, d] (GQA: fewer k/v heads; MLA: another v head dim); ``lse`` float32
[b, heads, s]. ``cu_q``/``cu_k`` (host cumulative lengths, b == 1): segment i attends only to
segment i. ``causal`` is top-left aligned.

Per backend: CPU ``aten._scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``), CUDA
``aten._scaled_dot_product_efficient_attention`` (+ ``_backward``), one call per segment; NPU
``torch_npu.npu_fusion_attention`` (lse from ``softmax_max``/``softmax_sum``) and
``npu_fusion_attention_grad`` fed max = lse, sum = 1; BNSD for dense blocks, TND with
``actual_seq_qlen/kvlen`` for segments (sparse_mode 3 causal segments, 2 a causal dense block, with
the 2048x2048 compressed mask).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from adaptor import run_state
from adaptor.ops.npu_attention_mask import NPU_SPARSE_CAUSAL, NPU_SPARSE_VARLEN_CAUSAL, npu_causal_mask

CuSeqlens = Optional[Sequence[int]]


def _expand_kv(x: Tensor, heads: int) -> Tensor:
    """GQA for kernels that want equal head counts: repeat each key/value head over its query group."""
    return x if x.size(1) == heads else x.repeat_interleave(heads // x.size(1), dim=1)


def _fold_kv_grad(g: Tensor, kv_heads: int) -> Tensor:
    if g.size(1) == kv_heads:
        return g
    b, n, s, d = g.shape
    return g.view(b, kv_heads, n // kv_heads, s, d).sum(2)


def _segments(cu_q: CuSeqlens, cu_k: CuSeqlens, sq: int, sk: int):
    if cu_q is None:
        return [(0, sq, 0, sk)]
    return [(q0, q1, k0, k1) for q0, q1, k0, k1 in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]) if q1 > q0]


# ----------------------------------------------------------------------- CPU and CUDA
def _pad_head_dim(x: Tensor, d: int) -> Tensor:
    """MLA's value head dim is below the query/key one; torch's kernels want one head dim."""
    return x if x.size(-1) == d else torch.nn.functional.pad(x, (0, d - x.size(-1)))


def _dense_forward(q, k, v, causal, scale):
    heads, dv = q.size(1), v.size(-1)
    if dv != q.size(-1):
        out, lse = _dense_forward(q, k, _pad_head_dim(v, q.size(-1)), causal, scale)
        return out[..., :dv], lse
    k, v = _expand_kv(k, heads), _expand_kv(v, heads)
    if q.device.type == "cuda":
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, causal, scale=scale)[:2]
        return out, lse[..., :q.size(2)].float()  # the kernel may pad the lse's rows to a multiple of 32
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, lse.float()


def _dense_backward(dout, q, k, v, out, lse, causal, scale):
    heads, kv_heads, d, dv_ = q.size(1), k.size(1), q.size(-1), v.size(-1)
    if dv_ != d:
        dq, dk, dv = _dense_backward(_pad_head_dim(dout, d), q, k, _pad_head_dim(v, d), _pad_head_dim(out, d), lse,
                                     causal, scale)
        return dq, dk, dv[..., :dv_]
    ke, ve = _expand_kv(k, heads), _expand_kv(v, heads)
    dout, out = dout.to(q.dtype), out.to(q.dtype)
    if q.device.type == "cuda":
        rows = -(-q.size(2) // 32) * 32
        lse_padded = torch.nn.functional.pad(lse, (0, rows - lse.size(-1)))
        zero = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dout, q, ke, ve, None, out, lse_padded, zero, zero, 0.0, [True, True, True, False], causal,
            scale=scale)
    else:
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, ke, ve, out, lse, 0.0, causal, scale=scale)
    return dq, _fold_kv_grad(dk, kv_heads), _fold_kv_grad(dv, kv_heads)


def _torch_forward(q, k, v, causal, scale, cu_q, cu_k):
    segs = _segments(cu_q, cu_k, q.size(2), k.size(2))
    if len(segs) == 1 and segs[0] == (0, q.size(2), 0, k.size(2)):
        return _dense_forward(q, k, v, causal, scale)
    out = q.new_zeros(*q.shape[:3], v.size(-1))
    lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    for q0, q1, k0, k1 in segs:
        if k1 == k0:
            continue
        o, l_ = _dense_forward(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], causal, scale)
        out[:, :, q0:q1] = o
        lse[:, :, q0:q1] = l_
    return out, lse


def _torch_backward(dout, q, k, v, out, lse, causal, scale, cu_q, cu_k):
    segs = _segments(cu_q, cu_k, q.size(2), k.size(2))
    if len(segs) == 1 and segs[0] == (0, q.size(2), 0, k.size(2)):
        return _dense_backward(dout, q, k, v, out, lse, causal, scale)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0, q1, k0, k1 in segs:
        if k1 == k0:
            continue
        g = _dense_backward(dout[:, :, q0:q1], q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1],
                            out[:, :, q0:q1], lse[:, :, q0:q1].contiguous(), causal, scale)
        dq[:, :, q0:q1] += g[0]
        dk[:, :, k0:k1] += g[1]
        dv[:, :, k0:k1] += g[2]
    return dq, dk, dv


# ----------------------------------------------------------------------------- NPU
def _npu_call_args(q, k, v, causal, cu_q, cu_k):
    """(layout, q, k, v, kwargs) for npu_fusion_attention(_grad); v padded to the q/k head dim."""
    dq_, dv_ = q.size(-1), v.size(-1)
    if dv_ < dq_:  # the kernel wants Dq = Dk >= Dv; equal dims keep it simple
        v = torch.nn.functional.pad(v, (0, dq_ - dv_))
    kwargs = {}
    if cu_q is not None:
        layout = "TND"  # [1, n, t, d] -> [t, n, d]
        q, k, v = (x[0].transpose(0, 1) for x in (q, k, v))
        # softmax_layout "TND": statistics per token, [t, n, 8] (the default order is per head, NTD).
        kwargs.update(actual_seq_qlen=list(cu_q[1:]), actual_seq_kvlen=list(cu_k[1:]), softmax_layout="TND")
        if causal:
            kwargs.update(atten_mask=npu_causal_mask(q.device), sparse_mode=NPU_SPARSE_VARLEN_CAUSAL)
    else:
        layout = "BNSD"
        if causal:
            kwargs.update(atten_mask=npu_causal_mask(q.device), sparse_mode=NPU_SPARSE_CAUSAL)
    return layout, q, k, v, kwargs


def _npu_lse(softmax_max: Tensor, softmax_sum: Tensor, layout: str) -> Tensor:
    lse = softmax_max[..., 0] + torch.log(softmax_sum[..., 0])
    return lse.transpose(0, 1)[None] if layout == "TND" else lse  # TND stats are [t, n, 8]


def _npu_stats(lse: Tensor, layout: str):
    stat = lse[0].transpose(0, 1) if layout == "TND" else lse
    stat = stat.unsqueeze(-1).expand(*stat.shape, 8).contiguous()
    return stat, torch.ones_like(stat)


def _npu_forward(q, k, v, causal, scale, cu_q, cu_k):
    import torch_npu

    dv_ = v.size(-1)
    layout, q_, k_, v_, kwargs = _npu_call_args(q, k, v, causal, cu_q, cu_k)
    out, smax, ssum = torch_npu.npu_fusion_attention(q_, k_, v_, q.size(1), layout, scale=scale, keep_prob=1.0,
                                                     **kwargs)[:3]
    if layout == "TND":
        out = out.transpose(0, 1)[None]
    return out[..., :dv_], _npu_lse(smax, ssum, layout)


def _npu_backward(dout, q, k, v, out, lse, causal, scale, cu_q, cu_k):
    import torch_npu

    dk_, dv_ = k.size(-1), v.size(-1)
    layout, q_, k_, v_, kwargs = _npu_call_args(q, k, v, causal, cu_q, cu_k)
    if dv_ < dk_:
        out, dout = (torch.nn.functional.pad(x, (0, dk_ - dv_)) for x in (out, dout))
    out, dout = out.to(q.dtype), dout.to(q.dtype)
    if layout == "TND":
        out, dout = out[0].transpose(0, 1), dout[0].transpose(0, 1)
    smax, ssum = _npu_stats(lse, layout)
    dq, dk, dv = torch_npu.npu_fusion_attention_grad(
        q_, k_, v_, dout, q.size(1), layout, softmax_max=smax, softmax_sum=ssum, attention_in=out,
        scale_value=scale, keep_prob=1.0, **kwargs)[:3]
    if layout == "TND":
        dq, dk, dv = (x.transpose(0, 1)[None] for x in (dq, dk, dv))
    return dq, dk, dv[..., :dv_]


# ------------------------------------------------------------------------- dispatch
def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, cu_q: CuSeqlens = None,
            cu_k: CuSeqlens = None) -> tuple[Tensor, Tensor]:
    if run_state.backend().name == "npu":
        return _npu_forward(q, k, v, causal, scale, cu_q, cu_k)
    return _torch_forward(q, k, v, causal, scale, cu_q, cu_k)


def backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float,
             cu_q: CuSeqlens = None, cu_k: CuSeqlens = None) -> tuple[Tensor, Tensor, Tensor]:
    if run_state.backend().name == "npu":
        return _npu_backward(dout, q, k, v, out, lse, causal, scale, cu_q, cu_k)
    return _torch_backward(dout, q, k, v, out, lse, causal, scale, cu_q, cu_k)


def merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor) -> tuple[Tensor, Tensor]:
    """Two partial attentions over disjoint keys -> their union (out in float32)."""
    new_lse = torch.logaddexp(lse, block_lse)
    # A row no key of either part reached keeps lse -inf and output 0.
    w_old = torch.exp(lse - new_lse).nan_to_num_(0.0).unsqueeze(-1)
    w_new = torch.exp(block_lse - new_lse).nan_to_num_(0.0).unsqueeze(-1)
    return out * w_old + block_out.float() * w_new, new_lse
