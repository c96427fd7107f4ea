"""STAND-IN torch_npu fused operators (attention): check each call's arguments, return CPU reference results.

``npu_fusion_attention`` follows torch_npu's documented signature and conventions:
layouts BSH/SBH/BSND/BNSD/TND, ``head_num`` = query heads (key/value may have fewer, a divisor),
``atten_mask`` bool with True = masked out, ``sparse_mode`` 0 (mask as given, plus the
pre/next_tockens band), 1 (full mask), 2 (left-up causal), 3 (right-down causal), 4 (band) — 2/3/4
take the compressed 2048x2048 upper-triangular mask; TND needs cumulative ``actual_seq_qlen`` /
``actual_seq_kvlen`` host lists. Returns the 7-tuple whose first element is the output, computed
with plain torch (differentiable, so backward is the reference backward).
"""
from __future__ import annotations

import sys

import torch

__all__ = ["npu_fusion_attention"]

LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
MAX_TOKENS = 2147483647


def _record(name, args, kwargs):
    sys.modules["torch_npu"].calls.append((name, args, kwargs))


def _to_bnsd(x, layout, d):
    if layout == "BSH":
        return x.reshape(x.size(0), x.size(1), -1, d).transpose(1, 2)
    if layout == "SBH":
        return x.reshape(x.size(0), x.size(1), -1, d).permute(1, 2, 0, 3)
    if layout == "BSND":
        return x.transpose(1, 2)
    return x  # BNSD


def _from_bnsd(x, layout):
    if layout == "BSH":
        return x.transpose(1, 2).flatten(2)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).flatten(2)
    if layout == "BSND":
        return x.transpose(1, 2)
    return x


def _band(s1, s2, pre, nxt):
    i = torch.arange(s1)[:, None]
    j = torch.arange(s2)[None, :]
    return (j > i + nxt) | (j < i - pre)  # True = masked


def _mask_for(sparse_mode, atten_mask, s1, s2, pre, nxt):
    compressed = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
    if sparse_mode in (2, 3, 4):
        assert atten_mask is not None and tuple(atten_mask.shape) == (2048, 2048), \
            f"sparse_mode {sparse_mode} needs the 2048x2048 compressed mask, got {None if atten_mask is None else tuple(atten_mask.shape)}"
        assert atten_mask.dtype == torch.bool and torch.equal(atten_mask.cpu(), compressed), \
            "the compressed mask must be the bool upper triangle (diagonal=1)"
        if sparse_mode == 2:
            return _band(s1, s2, MAX_TOKENS, 0)
        if sparse_mode == 3:
            return _band(s1, s2, MAX_TOKENS, s2 - s1)
        return _band(s1, s2, pre, nxt)
    if sparse_mode == 1:
        assert atten_mask is not None, "sparse_mode 1 needs a full atten_mask"
        return atten_mask.cpu()
    assert sparse_mode == 0, f"sparse_mode {sparse_mode} is not one the stand-in knows"
    band = _band(s1, s2, pre, nxt)
    if atten_mask is None:
        return band
    assert atten_mask.dtype in (torch.bool, torch.uint8), f"atten_mask dtype {atten_mask.dtype}"
    assert tuple(atten_mask.shape[-2:]) == (s1, s2) and atten_mask.dim() in (2, 4), \
        f"atten_mask shape {tuple(atten_mask.shape)} is not SS/B1SS/BNSS/11SS for ({s1}, {s2})"
    return atten_mask.cpu().bool() | band


def _attend(q, k, v, mask, scale, keep_prob):
    """q [b, n1, s1, d], k/v [b, n2, s2, d], mask broadcastable to [b, n1, s1, s2], True = masked."""
    n1, n2 = q.size(1), k.size(1)
    k = k.repeat_interleave(n1 // n2, dim=1)
    v = v.repeat_interleave(n1 // n2, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(mask.to(scores.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows -> 0
    if keep_prob < 1.0:
        probs = torch.nn.functional.dropout(probs, p=1.0 - keep_prob)
    return torch.matmul(probs, v.float()).to(q.dtype)


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=MAX_TOKENS,
                         next_tockens=MAX_TOKENS, inner_precise=0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
    _record("npu_fusion_attention", (query, key, value, head_num, input_layout), dict(
        pse=pse, padding_mask=padding_mask, atten_mask=atten_mask, scale=scale, keep_prob=keep_prob,
        pre_tockens=pre_tockens, next_tockens=next_tockens, actual_seq_qlen=actual_seq_qlen,
        actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode))
    assert input_layout in LAYOUTS, f"input_layout {input_layout!r} not in {LAYOUTS}"
    assert isinstance(head_num, int) and head_num > 0, f"head_num {head_num!r} must be a positive int"
    assert pse is None and padding_mask is None and prefix is None, "the stand-in supports no pse/padding_mask/prefix"
    assert query.dtype == key.dtype == value.dtype and query.dtype in (torch.float16, torch.bfloat16, torch.float32)
    assert isinstance(scale, float) and 0.0 < keep_prob <= 1.0, (scale, keep_prob)
    assert tuple(key.shape) == tuple(value.shape), f"key {tuple(key.shape)} and value {tuple(value.shape)} differ"
    ndim = 3 if input_layout in ("BSH", "SBH", "TND") else 4
    assert query.dim() == ndim and key.dim() == ndim, f"{input_layout} wants {ndim}-d tensors"

    if input_layout == "TND":
        t, n1, d = query.shape
        assert n1 == head_num, f"head_num {head_num} != query heads {n1}"
        assert isinstance(actual_seq_qlen, list) and isinstance(actual_seq_kvlen, list), \
            "TND needs actual_seq_qlen and actual_seq_kvlen as host int lists"
        assert actual_seq_qlen[-1] == t and actual_seq_kvlen[-1] == key.size(0), "cumulative lengths must end at T"
        assert all(b > a for a, b in zip([0] + actual_seq_qlen, actual_seq_qlen)), "actual_seq_qlen not increasing"
        assert sparse_mode in (0, 2, 3, 4, 7, 8)
        outs = []
        for q0, q1, k0, k1 in zip([0] + actual_seq_qlen, actual_seq_qlen, [0] + actual_seq_kvlen, actual_seq_kvlen):
            mask = _mask_for(sparse_mode, atten_mask, q1 - q0, k1 - k0, pre_tockens, next_tockens)
            o = _attend(query[q0:q1].transpose(0, 1)[None], key[k0:k1].transpose(0, 1)[None],
                        value[k0:k1].transpose(0, 1)[None], mask, scale, keep_prob)
            outs.append(o[0].transpose(0, 1))
        out = torch.cat(outs)
    else:
        assert actual_seq_qlen is None and actual_seq_kvlen is None, "actual_seq_* only with TND"
        if input_layout in ("BSH", "SBH"):
            h1 = query.size(2)
            assert h1 % head_num == 0, f"H {h1} not divisible by head_num {head_num}"
            d = h1 // head_num
            assert key.size(2) % d == 0, f"key H {key.size(2)} not a multiple of D {d}"
        else:
            hdim = 2 if input_layout == "BSND" else 1
            assert query.size(hdim) == head_num, f"head_num {head_num} != query heads {query.size(hdim)}"
            d = query.size(3)
            assert key.size(3) == d
        q, k, v = (_to_bnsd(x, input_layout, d) for x in (query, key, value))
        assert q.size(1) % k.size(1) == 0, f"query heads {q.size(1)} not a multiple of key heads {k.size(1)}"
        mask = _mask_for(sparse_mode, atten_mask, q.size(2), k.size(2), pre_tockens, next_tockens)
        out = _from_bnsd(_attend(q, k, v, mask, scale, keep_prob), input_layout)
    empty = torch.empty(0)
    return out, empty, empty, empty, 0, 0, 0
