"""CPU reference results of the torch_npu operators the project calls, in plain torch (so autograd works).

Each function takes the schema's argument names (``self`` included) with every default filled
in, and returns what torch_npu's meta function says the op returns: the same number of outputs,
shapes and dtypes (``_contract`` checks this on every call). ``None`` marks an output the
reference does not model. Arguments were already checked by the schema, the meta rule and
``_rules``; nothing here re-checks them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_TOKENS = 2147483647
COMPRESSED_MASK = 2048  # sparse_mode 2/3/4 take this square upper-triangular mask


def npu_rms_norm(self, gamma, epsilon):
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    xf = self.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(self.dtype), rstd


def npu_swiglu(self, dim):
    a, b = self.float().chunk(2, dim)
    return (F.silu(a) * b).to(self.dtype)


def npu_rotary_mul(self, r1, r2, rotary_mode, rotate):
    x = self
    if rotary_mode == "half":
        x1, x2 = x.chunk(2, -1)
        rotated = torch.cat((-x2, x1), dim=-1)
    else:
        rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    return (x.float() * r1.float() + rotated.float() * r2.float()).to(x.dtype)


# ------------------------------------------------------------------------------------ attention
LOWEST = torch.finfo(torch.float32).min  # softmax_max of a row with no visible key (see _softmax_stats)


def _dims(query, key, value, head_num, layout):
    """(d, dv): the head dim of query/key and of value."""
    if layout in ("BSH", "SBH"):
        d = query.size(2) // head_num
        return d, value.size(2) * d // key.size(2)
    return query.size(-1), value.size(-1)


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


def _sequences(actual_seq_qlen, actual_seq_kvlen):
    """(q0, q1, k0, k1) of each TND sequence; trailing zero lengths (batches left out) are dropped."""
    used = len(actual_seq_qlen)
    while used and actual_seq_qlen[used - 1] == 0:
        used -= 1
    q, k = list(actual_seq_qlen[:used]), list(actual_seq_kvlen[:used])
    return list(zip([0] + q[:-1], q, [0] + k[:-1], k))


def _band(s1, s2, pre, nxt):
    """True = masked: key j is visible to query i when i - pre <= j <= i + nxt."""
    i = torch.arange(s1)[:, None]
    j = torch.arange(s2)[None, :]
    return (j > i + nxt) | (j < i - pre)


def visible_mask(sparse_mode, atten_mask, s1, s2, pre, nxt):
    """The [.., s1, s2] bool mask (True = masked) a sparse_mode and its arguments stand for."""
    if atten_mask is None:  # the attention page: without atten_mask, sparse_mode and the band do not apply
        return torch.zeros(s1, s2, dtype=torch.bool)
    if sparse_mode == 2:  # leftUpCausal
        return _band(s1, s2, MAX_TOKENS, 0)
    if sparse_mode == 3:  # rightDownCausal
        return _band(s1, s2, MAX_TOKENS, s2 - s1)
    if sparse_mode == 4:  # band, counted from the bottom-right corner
        return _band(s1, s2, pre, nxt + s2 - s1)
    if sparse_mode == 1:  # allMask: the full mask as given
        return atten_mask.bool()
    return atten_mask.bool() | _band(s1, s2, pre, nxt)  # defaultMask: the mask and the pre/next band


def _softmax_stats(scores):
    """Row max and sum of exp(score - max) of masked scores (-inf = masked), float32, [..., s1].

    torch_npu-npu_fusion_attention.md, outputs 2 and 3: the max and the sum of the softmax, kept for
    the backward, so lse = max + log(sum). A row with no visible key has none; the stand-in gives it
    max = LOWEST (finite, so exp(LOWEST - other max) = 0 where stats are merged) and sum = 0, i.e.
    lse = -inf: such a row adds nothing when partial attentions are combined.
    """
    row_max = scores.amax(-1)
    row_max = row_max.masked_fill(torch.isneginf(row_max), LOWEST)
    return row_max, torch.exp(scores - row_max[..., None]).sum(-1)


def _attend(q, k, v, mask, scale, keep_prob, invalid_rows_zero):
    """q [b, n1, s1, d], k/v [b, n2, s2, d], mask broadcastable to [b, n1, s1, s2], True = masked.

    Returns the output in q's dtype and the softmax max and sum [b, n1, s1] (float32, no gradient:
    torch_npu's backward takes only the output's). A query row whose every key is masked is undefined
    on the device unless the call asked for row-invalid correction; here it is NaN then, so a caller
    that relies on it shows at once.
    """
    n1, n2 = q.size(1), k.size(1)
    k = k.repeat_interleave(n1 // n2, dim=1)
    v = v.repeat_interleave(n1 // n2, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(mask, float("-inf"))
    with torch.no_grad():
        row_max, row_sum = _softmax_stats(scores)
    probs = torch.softmax(scores, dim=-1)
    dead = mask.all(-1, keepdim=True).expand(probs.shape[:-1] + (1,))
    probs = probs.masked_fill(dead, 0.0)
    if keep_prob < 1.0:
        probs = F.dropout(probs, p=1.0 - keep_prob)
    out = torch.matmul(probs, v.float())
    if not invalid_rows_zero:
        out = out.masked_fill(dead, float("nan"))
    return out.to(q.dtype), row_max, row_sum


def _stats_out(stats, layout, softmax_layout):
    """[.., 8] float32 softmax_max/softmax_sum as torch_npu lays them out, from per-call (BNSD) or
    per-sequence ([1, N, s]) row statistics.

    BSH/SBH/BSND/BNSD: [B, N, S1, 8]. TND: a [T, N, 8] tensor (the meta shape); by
    torch_npu-npu_fusion_attention.md (softmax_layout) its data are in NTD order unless
    softmax_layout="TND", per sequence: each sequence's [N, s, 8] block in turn, which is how
    MindSpeed's ring attention reads them (mindspeed/core/context_parallel/utils.py, flatten_softmax).
    """
    if layout != "TND":
        return stats.unsqueeze(-1).expand(*stats.shape, 8).contiguous()
    n = stats[0].size(1)
    if softmax_layout == "TND":
        rows = torch.cat([s[0].transpose(0, 1) for s in stats])
    else:
        rows = torch.cat([s[0].reshape(-1) for s in stats]).view(-1, n)
    return rows.unsqueeze(-1).expand(*rows.shape, 8).contiguous()


def _stats_in(stats, layout, softmax_layout, sequences):
    """The inverse of _stats_out: [B, N, S1] float32, or one [1, N, s] per TND sequence."""
    stats = stats[..., 0].float()
    if layout != "TND":
        return stats
    n = stats.size(1)
    if softmax_layout == "TND":
        return [stats[q0:q1].transpose(0, 1)[None] for q0, q1, _, _ in sequences]
    flat = stats.reshape(-1)
    return [flat[q0 * n:q1 * n].view(1, n, q1 - q0) for q0, q1, _, _ in sequences]


def _rows_defined(inner_precise, sparse_mode, s1, s2):
    # torch_npu-npu_fusion_attention.md, inner_precise: 2 turns on invalid-row computation (rows
    # with every key masked give 0); the kernel turns it on itself where such rows must exist
    # (sparse_mode 3 with Sq > Skv). Elsewhere those rows are undefined.
    return inner_precise == 2 or (sparse_mode == 3 and s1 > s2)


def _tnd(x, a, b):
    """Rows a:b of a TND tensor as [1, N, s, D]."""
    return x[a:b].transpose(0, 1)[None]


def npu_fusion_attention(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
                         keep_prob, pre_tockens, next_tockens, inner_precise, prefix, actual_seq_qlen,
                         actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync, softmax_layout, sink,
                         dropout_mask, seed, offset):
    if input_layout == "TND":
        outs, maxes, sums = [], [], []
        for q0, q1, k0, k1 in _sequences(actual_seq_qlen, actual_seq_kvlen):
            mask = visible_mask(sparse_mode, atten_mask, q1 - q0, k1 - k0, pre_tockens, next_tockens)
            o, m, s = _attend(_tnd(query, q0, q1), _tnd(key, k0, k1), _tnd(value, k0, k1), mask, scale, keep_prob,
                              _rows_defined(inner_precise, sparse_mode, q1 - q0, k1 - k0))
            outs.append(o[0].transpose(0, 1))
            maxes.append(m)
            sums.append(s)
        out = torch.cat(outs)
    else:
        d, dv = _dims(query, key, value, head_num, input_layout)
        q = _to_bnsd(query, input_layout, d)
        k = _to_bnsd(key, input_layout, d)
        v = _to_bnsd(value, input_layout, dv)
        mask = visible_mask(sparse_mode, atten_mask, q.size(2), k.size(2), pre_tockens, next_tockens)
        o, maxes, sums = _attend(q, k, v, mask, scale, keep_prob,
                                 _rows_defined(inner_precise, sparse_mode, q.size(2), k.size(2)))
        out = _from_bnsd(o, input_layout)
    # softmax_out (output 4) is reserved and unused (the attention page): zeros of the meta's [0].
    return (out, _stats_out(maxes, input_layout, softmax_layout), _stats_out(sums, input_layout, softmax_layout),
            None, 0, 0, 0)


def _attend_grad(q, k, v, dy, out, row_max, row_sum, mask, scale):
    """Grads of q [b, n1, s1, d], k/v [b, n2, s2, *] (float32) from the saved row max/sum [b, n1, s1]
    and output, the flash-attention backward of OPS-ADV FlashAttentionScoreGrad.md: P is rebuilt as
    exp(scale * qk - max) / sum on the visible keys, D = rowsum(dy * out), dS = P * (dy v^T - D).
    Nothing is taken from a forward re-run, so the statistics and output of a merged (ring)
    attention give each key block its share of the full gradient.
    """
    n1, n2 = q.size(1), k.size(1)
    q, dy, out = q.float(), dy.float(), out.float()
    kf = k.float().repeat_interleave(n1 // n2, dim=1)
    vf = v.float().repeat_interleave(n1 // n2, dim=1)
    scores = torch.matmul(q, kf.transpose(-1, -2)) * scale
    probs = torch.exp(scores - row_max[..., None]) / row_sum[..., None]
    probs = torch.where(mask, 0.0, probs)  # masked keys (and rows without any) take no share
    dv = torch.matmul(probs.transpose(-1, -2), dy)
    ds = probs * (torch.matmul(dy, vf.transpose(-1, -2)) - (dy * out).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kf) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale

    def per_kv_head(x):  # GQA: a key/value head's grad sums over the query heads that share it
        return x.unflatten(1, (n2, n1 // n2)).sum(2)

    return dq, per_kv_head(dk), per_kv_head(dv)


def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, pse, padding_mask, atten_mask,
                              softmax_max, softmax_sum, softmax_in, attention_in, scale_value, keep_prob,
                              pre_tockens, next_tockens, inner_precise, seed, offset, numels, prefix,
                              actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync,
                              softmax_layout, sink):
    """(dq, dk, dv, dpse, dsink) from the forward's softmax_max, softmax_sum and attention_in."""
    with torch.no_grad():
        if input_layout == "TND":
            sequences = _sequences(actual_seq_qlen, actual_seq_kvlen)
            maxes = _stats_in(softmax_max, input_layout, softmax_layout, sequences)
            sums = _stats_in(softmax_sum, input_layout, softmax_layout, sequences)
            dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32) for t in (query, key, value))
            for (q0, q1, k0, k1), m, s in zip(sequences, maxes, sums):
                mask = visible_mask(sparse_mode, atten_mask, q1 - q0, k1 - k0, pre_tockens, next_tockens)
                grads = _attend_grad(_tnd(query, q0, q1), _tnd(key, k0, k1), _tnd(value, k0, k1), _tnd(dy, q0, q1),
                                     _tnd(attention_in, q0, q1), m, s, mask, scale_value)
                for total, g, (a, b) in zip((dq, dk, dv), grads, ((q0, q1), (k0, k1), (k0, k1))):
                    total[a:b] = g[0].transpose(0, 1)
        else:
            d, dvd = _dims(query, key, value, head_num, input_layout)
            q = _to_bnsd(query, input_layout, d)
            k = _to_bnsd(key, input_layout, d)
            mask = visible_mask(sparse_mode, atten_mask, q.size(2), k.size(2), pre_tockens, next_tockens)
            grads = _attend_grad(q, k, _to_bnsd(value, input_layout, dvd), _to_bnsd(dy, input_layout, dvd),
                                 _to_bnsd(attention_in, input_layout, dvd),
                                 _stats_in(softmax_max, input_layout, softmax_layout, None),
                                 _stats_in(softmax_sum, input_layout, softmax_layout, None), mask, scale_value)
            dq, dk, dv = (_from_bnsd(g, input_layout) for g in grads)
    # dpse: None without pse (the meta function); dsink: zeros of the meta's [0] without sink.
    return dq.to(query.dtype), dk.to(query.dtype), dv.to(query.dtype), None, None


# ------------------------------------------------------------------------------------------ MoE
def npu_grouped_matmul(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale,
                       group_list, activation_input, activation_quant_scale, activation_quant_offset,
                       split_item, group_type, group_list_type, act_type, tuning_config, output_dtype,
                       x_dtype, weight_dtype, scale_dtype, per_token_scale_dtype):
    (a,) = x
    counts = group_list.tolist() if group_list_type == 1 else torch.diff(group_list, prepend=group_list.new_zeros(1)).tolist()
    off = [0]
    for c in counts:
        off.append(off[-1] + c)
    if group_type == 0:  # groups split x's rows (M)
        ws = list(weight[0]) if len(weight) == 1 and weight[0].dim() == 3 else weight
        out = a.new_zeros(a.shape[0], ws[0].shape[1])
        for e, w in enumerate(ws):
            out[off[e]:off[e + 1]] = a[off[e]:off[e + 1]] @ w
        return [out]
    (b,) = weight  # group_type 2: groups split K, which is x's columns and weight's rows
    return [torch.stack([a[:, off[e]:off[e + 1]] @ b[off[e]:off[e + 1]] for e in range(len(counts))])]


def npu_moe_token_permute(tokens, indices, num_out_tokens, padded_mode):
    """Rows sorted by expert id (stable); sorted_indices[t * topk + j] is the row of token t's j-th pick."""
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    flat = indices.reshape(-1)
    n = flat.numel()
    num = num_out_tokens or 0
    keep = min(num, n) if num > 0 else n + num
    first = torch.argsort(flat, stable=True)
    sorted_indices = torch.argsort(first, stable=True).to(torch.int32)
    return tokens.index_select(0, first[:keep] // topk), sorted_indices


def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape):
    """out[t] = sum_j probs[t, j] * permuted[sorted_indices[t * topk + j]]; without probs topk is 1."""
    topk = 1 if probs is None else probs.size(1)
    rows = permuted_tokens.index_select(0, sorted_indices.long())
    rows = rows.view(sorted_indices.numel() // topk, topk, -1)
    if probs is None:
        return rows.sum(1)
    return (rows.float() * probs.float().unsqueeze(-1)).sum(1).to(permuted_tokens.dtype)
