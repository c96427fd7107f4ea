"""The torch_npu STAND-IN's attention statistics and backward, which context-parallel ring attention needs.

Ring attention on NPU runs ``npu_fusion_attention`` per key block, merges the blocks with the
softmax statistics it returns (softmax_max, softmax_sum; lse = max + log(sum)), and runs
``npu_fusion_attention_grad`` per block with the MERGED statistics and output. So the stand-in must
(a) return true statistics, (b) compute the backward from the statistics and output it is given,
and (c) thereby give each key block its share of the full gradient. (d) Calls the kernel would
refuse are refused.

One child interpreter imports the stand-in (tests/npu_standin) and reports errors as JSON; masks
and log-sum-exps are rebuilt here independently of the stand-in's own. Tolerance: fp32 throughout;
the same sums in another order stay near fp32 rounding (1e-7 relative, a few 1e-6 absolute on O(1)
values), so 1e-5 of max(1, max |expected|); a wrong mask element, scale or statistic is off by
> 1e-2 here.
"""
from __future__ import annotations

import pytest

from helpers.npu_contract import standin_env
from helpers.processes import run_child, tagged_json

TOL = 1e-5

CHILD = r"""
import json, math
import torch, torch_npu
from torch_npu import ContractViolation

torch.manual_seed(0)
SCALE = 0.35
CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # the compressed mask of sparse_mode 2/3
LOWEST = torch.finfo(torch.float32).min
facts = {"lse": {}, "lanes": {}, "grad": {}, "split": {}, "refused": {}}


def err(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1.0)).item()


def lse_ref(q, k, masked, scale):
    # q [b, n1, s1, d], k [b, n2, s2, d], masked [.., s1, s2] (True = masked): log-sum-exp per row.
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(masked, float("-inf"))
    return torch.logsumexp(scores, -1)


def lse_of(m, s):
    assert torch.equal(m, m[..., :1].expand_as(m)) and torch.equal(s, s[..., :1].expand_as(s))  # 8 equal lanes
    return m[..., 0] + torch.log(s[..., 0])


def leaves(*ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


def check(name, layout, q, k, v, heads, lse_want=None, **kw):
    # Forward with autograd, the grad op fed the forward's own statistics, and (a) the statistics.
    q, k, v = leaves(q, k, v)
    out, m, s, softmax_out, *_ = torch_npu.npu_fusion_attention(q, k, v, heads, layout, scale=SCALE, **kw)
    dy = torch.randn(out.shape)
    out.backward(dy)
    if lse_want is not None:
        got = lse_of(m, s)
        live = torch.isfinite(lse_want)
        facts["lse"][name] = err(got[live], lse_want[live])
        facts["lanes"][name] = [bool((torch.isinf(got) == ~live).all()), int((~live).sum())]
    grads = torch_npu.npu_fusion_attention_grad(
        q.detach(), k.detach(), v.detach(), dy, heads, layout, softmax_max=m, softmax_sum=s,
        softmax_in=softmax_out, attention_in=out.detach(), scale_value=SCALE, **kw)
    dq, dk, dv, dpse, dsink = grads
    facts["grad"][name] = [err(dq, q.grad), err(dk, k.grad), err(dv, v.grad), dpse is None, list(dsink.shape)]


# SBH, causal (sparse_mode 2 with the compressed mask): [S, B, N*D].
S, B, N, D = 16, 2, 4, 8
q, k, v = (torch.randn(S, B, N * D) for _ in range(3))
bnsd = lambda x, n: x.reshape(S, B, n, -1).permute(1, 2, 0, 3)
causal = torch.ones(S, S, dtype=torch.bool).triu(1)
check("sbh_causal", "SBH", q, k, v, N, lse_ref(bnsd(q, N), bnsd(k, N), causal, SCALE),
      atten_mask=CAUSAL, sparse_mode=2)

# BNSD with a full [B, 1, S, S] atten_mask, one query row fully masked (defined as 0 by inner_precise 2).
q, k, v = (torch.randn(B, N, S, D) for _ in range(3))
mask = torch.rand(B, 1, S, S) < 0.4
mask[..., 0] = False  # every row sees key 0 ...
mask[1, 0, 5] = True  # ... but this one, which sees nothing
check("bnsd_mask", "BNSD", q, k, v, N, lse_ref(q, k, mask, SCALE), atten_mask=mask, inner_precise=2)
_, m, s, *_ = torch_npu.npu_fusion_attention(q, k, v, N, "BNSD", atten_mask=mask, scale=SCALE, inner_precise=2)
facts["dead_row"] = [m[1, :, 5, 0].tolist() == [LOWEST] * N, s[1, :, 5, 0].tolist() == [0.0] * N]

# TND, two sequences, rightDownCausal (sparse_mode 3): Sq 5/7, Skv 7/9.
qlen, kvlen = [5, 12], [7, 16]
q, k, v = torch.randn(12, N, D), torch.randn(16, N, D), torch.randn(16, N, D)
want = []  # [N, s] per sequence
for q0, q1, k0, k1 in zip([0, 5], qlen, [0, 7], kvlen):
    s1, s2 = q1 - q0, k1 - k0
    masked = torch.arange(s2)[None, :] > torch.arange(s1)[:, None] + (s2 - s1)
    want.append(lse_ref(q[q0:q1].transpose(0, 1)[None], k[k0:k1].transpose(0, 1)[None], masked, SCALE)[0])
tnd = dict(atten_mask=CAUSAL, sparse_mode=3, actual_seq_qlen=qlen, actual_seq_kvlen=kvlen)
# softmax_layout "TND": [T, N, 8] by token; default: each sequence's [N, s, 8] block in turn (NTD).
check("tnd_causal_tnd_stats", "TND", q, k, v, N, torch.cat([w.transpose(0, 1) for w in want]),
      softmax_layout="TND", **tnd)
check("tnd_causal_ntd_stats", "TND", q, k, v, N, torch.cat([w.reshape(-1) for w in want]).view(12, N), **tnd)

# GQA: 4 query heads on 2 key/value heads, BSH, causal.
q, k, v = torch.randn(B, S, 4 * D), torch.randn(B, S, 2 * D), torch.randn(B, S, 2 * D)
bsh = lambda x: x.reshape(B, S, -1, D).transpose(1, 2)
check("bsh_gqa_causal", "BSH", q, k, v, 4, lse_ref(bsh(q), bsh(k), causal, SCALE), atten_mask=CAUSAL, sparse_mode=2)

# (c) Ring: two key blocks attended apart, merged by their lse; the grad op on each block alone with
# the MERGED lse (softmax_max = lse x 8, softmax_sum = 1) and output gives that block's share.
for name, heads_kv in (("sbh", N), ("sbh_gqa", 2)):
    q, k, v = torch.randn(S, B, N * D), torch.randn(S, B, heads_kv * D), torch.randn(S, B, heads_kv * D)
    k1 = 6
    blocks = [torch_npu.npu_fusion_attention(q, k[a:b], v[a:b], N, "SBH", scale=SCALE) for a, b in ((0, k1), (k1, S))]
    lses = [lse_of(m, s) for _, m, s, *_ in blocks]
    lse = torch.logaddexp(*lses)  # [B, N, S]
    weight = lambda l: torch.exp(l - lse).permute(2, 0, 1).repeat_interleave(D, dim=-1)  # -> [S, B, N*D]
    merged = sum(weight(l) * o for (o, *_), l in zip(blocks, lses))
    qf, kf, vf = leaves(q, k, v)
    full, *_ = torch_npu.npu_fusion_attention(qf, kf, vf, N, "SBH", scale=SCALE)
    dy = torch.randn(full.shape)
    full.backward(dy)
    stats = dict(softmax_max=lse.unsqueeze(-1).expand(B, N, S, 8).contiguous(), softmax_sum=torch.ones(B, N, S, 8),
                 attention_in=merged, scale_value=SCALE)
    parts = [torch_npu.npu_fusion_attention_grad(q, k[a:b], v[a:b], dy, N, "SBH", **stats)
             for a, b in ((0, k1), (k1, S))]
    facts["split"][name] = [err(merged, full), err(parts[0][0] + parts[1][0], qf.grad),
                            err(torch.cat([parts[0][1], parts[1][1]]), kf.grad),
                            err(torch.cat([parts[0][2], parts[1][2]]), vf.grad),
                            err(parts[0][0], qf.grad)]  # one block alone is NOT the gradient


# (d) Calls the kernel refuses.
def outcome(fn):
    try:
        fn()
        return ["ok", ""]
    except ContractViolation as exc:
        return ["ContractViolation", str(exc)]


q, k, v = (torch.randn(S, B, N * D) for _ in range(3))
out, m, s, *_ = torch_npu.npu_fusion_attention(q, k, v, N, "SBH", scale=SCALE)
dy = torch.randn(out.shape)
base = dict(softmax_max=m, softmax_sum=s, attention_in=out, scale_value=SCALE)
grad = lambda dy=dy, **kw: outcome(lambda: torch_npu.npu_fusion_attention_grad(q, k, v, dy, N, "SBH", **{**base, **kw}))
facts["refused"] = {
    "good": grad(),
    "missing_softmax_max": grad(softmax_max=None),
    "missing_attention_in": grad(attention_in=None),
    "softmax_max_without_lanes": grad(softmax_max=m[..., 0]),
    "softmax_sum_wrong_seq": grad(softmax_sum=s[:, :, :-1]),
    "softmax_max_bf16": grad(softmax_max=m.bfloat16()),
    "attention_in_wrong_shape": grad(attention_in=out[:-1]),
    "dy_wrong_dtype": grad(dy=dy.double()),
    "softmax_in_not_empty": grad(softmax_in=torch.zeros(3)),
    "dropout": grad(keep_prob=0.9),
    "forward_argument_name": grad(scale=SCALE),
    "softmax_layout_not_tnd": grad(softmax_layout="TND"),
}
print("FACTS" + json.dumps(facts))
"""


@pytest.fixture(scope="module")
def facts():
    out = run_child(CHILD, env=standin_env(), timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return tagged_json(out.stdout)


STATS_CASES = ["sbh_causal", "bnsd_mask", "tnd_causal_tnd_stats", "tnd_causal_ntd_stats", "bsh_gqa_causal"]


@pytest.mark.parametrize("case", STATS_CASES)
def test_softmax_stats_are_the_masked_logsumexp(facts, case):
    assert facts["lse"][case] <= TOL, facts["lse"]
    all_match, dead_rows = facts["lanes"][case]
    assert all_match, case  # lse is -inf exactly where no key is visible
    assert dead_rows == (4 if case == "bnsd_mask" else 0)  # bnsd_mask: one query row, masked for all 4 heads


def test_a_row_without_visible_keys_has_max_lowest_and_sum_zero(facts):
    assert facts["dead_row"] == [True, True]


@pytest.mark.parametrize("case", STATS_CASES)
def test_grad_from_the_forwards_stats_equals_autograd(facts, case):
    dq, dk, dv, no_dpse, dsink_shape = facts["grad"][case]
    assert max(dq, dk, dv) <= TOL, facts["grad"][case]
    assert no_dpse and dsink_shape == [0]  # torch_npu's meta: dpse None without pse, dsink empty without sink


@pytest.mark.parametrize("case", ["sbh", "sbh_gqa"])
def test_block_grads_with_merged_stats_sum_to_the_full_gradient(facts, case):
    merged_out, dq, dk, dv, one_block_dq = facts["split"][case]
    assert merged_out <= TOL  # the partial outputs merged by their lse are the full attention
    assert max(dq, dk, dv) <= TOL, facts["split"][case]
    assert one_block_dq > 1e-2  # the check can fail: one block alone is far from the gradient


@pytest.mark.parametrize("case, says", [
    ("missing_softmax_max", "softmax_max missing"),
    ("missing_attention_in", "attention_in missing"),
    ("softmax_max_without_lanes", "softmax_max is (2, 4, 16)"),
    ("softmax_sum_wrong_seq", "the forward gives (2, 4, 16, 8)"),
    ("softmax_max_bf16", "torch.bfloat16"),
    ("attention_in_wrong_shape", "attention_in is (15, 2, 32)"),
    ("dy_wrong_dtype", "dy is (16, 2, 32) torch.float64"),
    ("softmax_in_not_empty", "softmax_in is reserved"),
    ("dropout", "keep_prob 0.9"),
    ("forward_argument_name", "Unknown keyword argument 'scale'"),
    ("softmax_layout_not_tnd", "softmax_layout 'TND' with input_layout SBH"),
])
def test_wrong_grad_calls_are_refused(facts, case, says):
    assert facts["refused"]["good"] == ["ok", ""]
    kind, message = facts["refused"][case]
    assert kind == "ContractViolation" and says in message, (case, kind, message)
