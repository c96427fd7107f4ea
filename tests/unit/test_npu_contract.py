"""The torch_npu contract harness: it catches what a real Ascend device would reject.

One child process imports the torch_npu STAND-IN (tests/npu_standin), which loads torch_npu
2.14.0's own schemas and meta shape rules (tests/npu_standin/contract, the pinned wheel's files), and
tries calls that are wrong in each way the contract can see: an argument name, an argument type,
an index dtype, an output shape (a reference that disagrees with torch_npu's meta function), and
the unpermute call Megatron's dispatchers used to make. It also runs every operator the adaptor
calls through ``adaptor.ops`` at the shapes and dtypes the tiny models use, against the CPU path.
"""
from __future__ import annotations

import pytest

from helpers.npu_contract import standin_env
from helpers.processes import run_child, tagged_json
from helpers.prefetch import prefetched

CHILD = r"""
import json, torch, torch_npu
from torch_npu import ContractViolation, StandinError, _contract
import adaptor
from adaptor import bootstrap, run_state
assert run_state.backend().name == "npu"
facts = {"loaded": {k: v for k, v in _contract.load().items() if k in ("defined", "skipped")}}

def outcome(fn):
    try:
        fn()
        return ["ok", ""]
    except (ContractViolation, StandinError) as exc:
        return [type(exc).__name__, str(exc)]
    except RuntimeError as exc:
        return ["RuntimeError", str(exc)]

g = torch.Generator().manual_seed(0)
x = torch.randn(8, 2, 64, generator=g).bfloat16()
w = torch.ones(64, dtype=torch.bfloat16)
T, K, H = 6, 2, 16
permuted = torch.randn(T * K, H, generator=g).bfloat16()
order = torch.randperm(T * K, generator=g)
q = torch.randn(16, 2, 4 * 32, generator=g).bfloat16()
kv = torch.randn(16, 2, 2 * 32, generator=g).bfloat16()

facts["cases"] = {
    "good_rms_norm": outcome(lambda: torch_npu.npu_rms_norm(x, w, epsilon=1e-6)),
    "wrong_argument_name": outcome(lambda: torch_npu.npu_rms_norm(x, w, eps=1e-6)),
    "wrong_argument_type": outcome(lambda: torch_npu.npu_fusion_attention(q, kv, kv, 4.0, "SBH")),
    "fp32_gamma_bf16_x": outcome(lambda: torch_npu.npu_rms_norm(x, w.float(), epsilon=1e-6)),
    "bf16_gamma_fp32_x": outcome(lambda: torch_npu.npu_rms_norm(x.float(), w, epsilon=1e-6)),
    "int64_sorted_indices": outcome(lambda: torch_npu.npu_moe_token_unpermute(
        permuted, order, torch.rand(T, K, generator=g).bfloat16(), restore_shape=[T, H])),
    "meta_rule_group_type": outcome(lambda: torch_npu.npu_grouped_matmul(
        [permuted], [torch.randn(H, 8).bfloat16()] * 2, group_list=torch.tensor([5, 12]), split_item=2,
        group_type=1)),
    "fp32_grouped_matmul_per_expert": outcome(lambda: torch_npu.npu_grouped_matmul(
        [permuted.float()], [torch.randn(H, 8)] * 2, group_list=torch.tensor([5, 12]), split_item=2,
        group_type=0, group_list_type=0)),
    "int32_group_list": outcome(lambda: torch_npu.npu_grouped_matmul(
        [permuted], [torch.randn(H, 8).bfloat16()] * 2, group_list=torch.tensor([5, 12], dtype=torch.int32),
        split_item=2, group_type=0, group_list_type=0)),
    "causal_without_compressed_mask": outcome(lambda: torch_npu.npu_fusion_attention(
        q, kv, kv, 4, "SBH", scale=0.1, sparse_mode=2)),
    "tnd_lengths_not_cumulative": outcome(lambda: torch_npu.npu_fusion_attention(
        q[:, 0].reshape(16, 4, 32), kv[:, 0].reshape(16, 2, 32), kv[:, 0].reshape(16, 2, 32), 4, "TND",
        scale=0.1, actual_seq_qlen=[10, 6], actual_seq_kvlen=[10, 6])),
}

# The unpermute defect: without probs the kernel takes top-k 1 and returns one row per sorted
# index, so Megatron's [T, H] view of the result fails, as on a device.
back = torch_npu.npu_moe_token_unpermute(permuted, order.int(), None, restore_shape=[T, H])
facts["unpermute_without_probs_rows"] = back.shape[0]
facts["cases"]["unpermute_defect_reintroduced"] = outcome(lambda: back.view(T, H))

# A reference that disagrees with torch_npu's meta function is a stand-in bug, and is caught:
def summing_reference(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape):
    rows = permuted_tokens.index_select(0, sorted_indices.long())
    return rows.view(restore_shape[0], -1, rows.shape[-1]).sum(1)  # T rows, where torch_npu says T * k

wrong = _contract.checked("npu_moe_token_unpermute", summing_reference)
facts["cases"]["wrong_output_shape"] = outcome(lambda: wrong(permuted, order.int(), None, restore_shape=[T, H]))
wrong_arity = _contract.checked("npu_rms_norm", lambda self, gamma, epsilon: self)
facts["cases"]["wrong_return_arity"] = outcome(lambda: wrong_arity(x, w, epsilon=1e-6))

# Every operator the adaptor calls, at the tiny models' shapes, in bf16: through adaptor.ops (the
# NPU path, contract-checked) against the CPU path of the same module.
from adaptor.ops import moe_permute, rmsnorm, swiglu
diffs = {}
xr = torch.randn(64, 2, 64, generator=g).bfloat16()
rel = lambda a, b: ((a.float() - b.float()).abs() / b.float().abs().clamp_min(1.0)).max().item()
diffs["rms_norm"] = rel(rmsnorm.rms_norm(xr, w.float(), 1e-6), rmsnorm._RMSNormFunction.apply(xr, w.float(), 1e-6))
h = torch.randn(64, 2, 2 * 96, generator=g).bfloat16()
diffs["swiglu"] = rel(swiglu.swiglu(h), swiglu._SwiGLUFunction.apply(h))
routing = torch.zeros(T, 4, dtype=torch.bool).scatter_(1, torch.randn(T, 4, generator=g).topk(K, 1).indices, True)
tokens = torch.randn(T, H, generator=g).bfloat16()
out, _, row_map = moe_permute.permute(tokens, routing, None, T * K)
merged = moe_permute.unpermute(out, row_map, tokens.shape)
facts["permute_round_trip"] = (merged.float() - K * tokens.float()).abs().max().item()
local = routing.clone(); local[:, 2:] = False  # this rank's 2 of 4 experts: 0..2 per token
out2, _, row_map2 = moe_permute.permute(tokens, local, None, int(local.sum()))
merged2 = moe_permute.unpermute(out2, row_map2, tokens.shape)
facts["uneven_round_trip"] = (merged2.float() - local.sum(1, keepdim=True) * tokens.float()).abs().max().item()
facts["diffs"] = diffs
facts["counts"] = dict(torch_npu.counts)
print("FACTS" + json.dumps(facts))
"""


@prefetched
def facts():
    out = run_child(CHILD, env=standin_env(ADAPTOR_QUIET="1"), timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return tagged_json(out.stdout)


def test_the_contract_comes_from_the_wheel(facts):
    # Most of torch_npu's 1,488 schema entries define as they are; the rest are aten names.
    assert facts["loaded"]["defined"] > 1400, facts["loaded"]


def test_a_correct_call_passes(facts):
    assert facts["cases"]["good_rms_norm"] == ["ok", ""]
    # fp32 gamma with bf16 x is one of the pairs the A2/A3 dtype table lists.
    assert facts["cases"]["fp32_gamma_bf16_x"] == ["ok", ""]


@pytest.mark.parametrize("case, kind, says", [
    ("wrong_argument_name", "ContractViolation", "Unknown keyword argument 'eps'"),
    ("wrong_argument_type", "ContractViolation", "head_num"),
    ("bf16_gamma_fp32_x", "ContractViolation", "gamma is torch.bfloat16 with self torch.float32"),
    ("int64_sorted_indices", "ContractViolation", "sorted_indices is torch.int64"),
    ("meta_rule_group_type", "ContractViolation", "group_type only supports -1, 0 and 2"),
    ("fp32_grouped_matmul_per_expert", "ContractViolation", "float32 needs a single x, weight and y"),
    ("int32_group_list", "ContractViolation", "group_list must be a 1-D int64 tensor"),
    ("causal_without_compressed_mask", "ContractViolation", "2048x2048"),
    ("tnd_lengths_not_cumulative", "ContractViolation", "cumulative"),
    ("wrong_output_shape", "StandinError", "the contract says (12, 16)"),
    ("wrong_return_arity", "StandinError", "reference returned 1 outputs, the contract 2"),
    ("unpermute_defect_reintroduced", "RuntimeError", "shape '[6, 16]' is invalid"),
])
def test_the_harness_rejects(facts, case, kind, says):
    got_kind, message = facts["cases"][case]
    assert got_kind == kind and says in message, (case, got_kind, message)


def test_unpermute_without_probs_is_top_k_one(facts):
    assert facts["unpermute_without_probs_rows"] == 12  # T * k rows, by torch_npu's own meta rule


def test_adaptor_ops_pass_the_contract_and_match_the_cpu_path(facts):
    counts = facts["counts"]
    for kernel in ("npu_rms_norm", "npu_swiglu", "npu_moe_token_permute", "npu_moe_token_unpermute"):
        assert counts.get(kernel, 0) > 0, counts
    # bf16 outputs rounded once each, at different points: at most one bf16 step (2^-7 relative) apart.
    assert facts["diffs"]["rms_norm"] <= 2 ** -7, facts["diffs"]
    assert facts["diffs"]["swiglu"] <= 2 ** -7, facts["diffs"]
    # Permute then merge without probs sums each token's k copies: k * token, exactly.
    assert facts["permute_round_trip"] == 0.0
    # Tokens with 0..2 of this rank's experts take the index path and still merge correctly.
    assert facts["uneven_round_trip"] == 0.0
    assert counts["npu_moe_token_permute"] == 1  # the uneven call did not reach the kernel
