"""--moe-grouped-gemm and --moe-permute-fusion against megatron-core's own modules.

GroupedExperts must equal SequentialMLP (same weights) forward and backward;
adaptor.ops.moe_permute must equal moe_utils' unfused permute/unpermute;
the NPU path is run against the torch_npu STAND-IN (tests/npu_standin),
which checks the kernels' arguments. A pretrain_gpt.py MoE run with both flags
against the run without them: tests/e2e/test_moe_fused_ops.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from helpers.npu_contract import standin_env
from helpers.paths import ROOT

os.environ.setdefault("ADAPTOR_BACKEND", "cpu")


from megatron.core.transformer.moe import moe_utils  # noqa: E402

from adaptor.ops import moe_permute  # noqa: E402


# Builds both expert modules in one process group; used here and in the NPU child.
EXPERTS_SETUP = r"""
import os, torch, torch.nn.functional as F
from megatron.core import parallel_state as ps
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.process_groups_config import ProcessGroupCollection
from adaptor.ops.grouped_matmul import GroupedExperts

if not torch.distributed.is_initialized():
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, store=torch.distributed.HashStore())
    ps.initialize_model_parallel()
PG = ProcessGroupCollection.use_mpu_process_groups()

def make_pair(glu=True, fusion=True, dtype=torch.float32, n=4, hidden=32, ffn=48):
    cfg = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=4, num_moe_experts=n,
        moe_ffn_hidden_size=ffn, ffn_hidden_size=ffn, gated_linear_unit=glu,
        activation_func=F.silu if glu else F.gelu, add_bias_linear=False, bias_activation_fusion=fusion,
        use_cpu_initialization=True, params_dtype=dtype)
    sub = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    torch.manual_seed(0)
    ref = SequentialMLP(n, cfg, sub, pg_collection=PG)
    ours = GroupedExperts(n, cfg, sub, pg_collection=PG)
    ours.load_state_dict(ref.state_dict())
    return ref, ours

def run_both(ref, ours, counts, dtype=torch.float32, hidden=32):
    g = torch.Generator().manual_seed(1)
    total = int(sum(counts))
    x = torch.randn(total, hidden, generator=g).to(dtype)
    p = torch.rand(total, generator=g)
    dy = torch.randn(total, hidden, generator=g).to(dtype)
    res = []
    for m in (ref, ours):
        m.zero_grad()
        xx, pp = x.clone().requires_grad_(), p.clone().requires_grad_()
        y, _ = m(xx, torch.tensor(counts), pp)
        y.backward(dy)
        res.append([y, xx.grad, pp.grad] + [q.grad for q in m.parameters()])
    return res
"""


@pytest.fixture(scope="module")
def experts_ns(cpu_training_process):
    ns = {}
    exec(EXPERTS_SETUP, ns)
    return SimpleNamespace(**ns)


@pytest.mark.parametrize("glu,fusion", [(True, True), (True, False), (False, False)])
def test_grouped_experts_equal_sequential_fp32(experts_ns, glu, fusion):
    ref, ours = experts_ns.make_pair(glu=glu, fusion=fusion)
    assert sorted(ref.state_dict()) == sorted(ours.state_dict())  # same checkpoint layout
    counts = [5, 0, 7, 3]  # expert 1 gets no tokens
    got_ref, got = experts_ns.run_both(ref, ours, counts)
    assert len(got_ref) == len(got) == 3 + 8
    for a, b in zip(got_ref, got):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    # The idle expert's weights get zero gradient, as in SequentialMLP.
    idle = ours.local_experts[1].linear_fc1.weight.grad
    assert idle is not None and not idle.any()


def test_grouped_experts_equal_sequential_bf16(experts_ns):
    # bf16: each product is rounded once per matmul in both; the CPU loop and
    # megatron's Linear may block the reductions differently -> 2 bf16 ulps (2^-7 relative).
    ref, ours = experts_ns.make_pair(dtype=torch.bfloat16)
    got_ref, got = experts_ns.run_both(ref, ours, [9, 4, 0, 11], dtype=torch.bfloat16)
    for a, b in zip(got_ref, got):
        torch.testing.assert_close(b.float(), a.float(), rtol=1.6e-2, atol=1e-2)


def test_grouped_gemm_swap_row():
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.moe.experts import SequentialMLP

    from adaptor.bootstrap import all_features
    from adaptor.layer_specs import module_swaps, swap_modules
    from adaptor.ops.grouped_matmul import GroupedExperts

    features = list(all_features())
    assert module_swaps(SimpleNamespace(moe_grouped_gemm=True), features).get(SequentialMLP) is GroupedExperts
    assert SequentialMLP not in module_swaps(SimpleNamespace(moe_grouped_gemm=False), features)
    spec = swap_modules(get_moe_module_spec(use_te=False, num_experts=4, moe_grouped_gemm=True),
                        module_swaps(SimpleNamespace(moe_grouped_gemm=True), features))
    assert spec.keywords["submodules"].experts.func is GroupedExperts


def test_validate_refuses_what_the_paths_cannot_run():
    from adaptor.backend import Backend
    from adaptor.features import ArgumentError, FeatureContext
    from patches.fusions.grouped_matmul import GroupedMatmulFusion
    from patches.fusions.moe_permute import MoePermuteFusion

    npu = FeatureContext(Backend("npu", "hccl", "test"), SimpleNamespace())
    cpu = FeatureContext(Backend("cpu", "gloo", "test"), SimpleNamespace())
    args = SimpleNamespace(moe_permute_fusion=True, moe_expert_capacity_factor=1.0)
    with pytest.raises(ArgumentError, match="capacity-factor"):
        MoePermuteFusion().validate(args, npu)
    MoePermuteFusion().validate(args, cpu)  # the torch path handles dropped tokens
    args = SimpleNamespace(moe_grouped_gemm=True, transformer_impl="local", fp8="hybrid", fp4=None)
    with pytest.raises(ArgumentError, match="fp8"):
        GroupedMatmulFusion().validate(args, cpu)
    GroupedMatmulFusion().validate(SimpleNamespace(moe_grouped_gemm=True, transformer_impl="local", fp8=None, fp4=None), cpu)


def _routing(num_tokens=37, num_experts=6, topk=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g)
    top = logits.topk(topk, dim=1).indices
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool).scatter_(1, top, True)
    probs = torch.zeros(num_tokens, num_experts).scatter_(1, top, torch.rand(num_tokens, topk, generator=g))
    return routing_map, probs


def test_expert_major_order_equals_argsort():
    routing_map, _ = _routing(num_tokens=50, num_experts=5, topk=2)
    routing_map[3] = False  # a token with no expert, as capacity dropping leaves
    ref = routing_map.T.contiguous().reshape(-1).argsort(descending=True, stable=True)
    for n in (int(routing_map.sum()), int(routing_map.sum()) + 7, 10):
        assert torch.equal(moe_permute.expert_major_order(routing_map, n), ref[:n])


@pytest.mark.parametrize("topk,dropped", [(1, False), (2, False), (3, False), (2, True)])
def test_permute_unpermute_equal_unfused(topk, dropped):
    routing_map, probs = _routing(topk=topk)
    if dropped:  # capacity dropping: tokens with fewer experts (the scatter-add path)
        routing_map[[0, 5, 6], 0] = False
        routing_map[9] = False
        probs = probs * routing_map
    num_out = int(routing_map.sum())
    hidden = 16
    tokens = torch.randn(routing_map.shape[0], hidden, generator=torch.Generator().manual_seed(3))
    results = []
    for fused in (False, True):
        t, p = tokens.clone().requires_grad_(), probs.clone().requires_grad_()
        if fused:
            out, pp, idx = moe_permute.permute(t, routing_map, p, num_out)
        else:
            out, pp, idx, _, _ = moe_utils.permute(t, routing_map, p, num_out_tokens=num_out)
        expert_out = out * 1.5 + 0.25  # stands for the experts
        if fused:
            back = moe_permute.unpermute(expert_out, idx, t.shape, probs=p)
        else:
            back = moe_utils.unpermute(expert_out, idx, t.shape, probs=p, routing_map=routing_map)
        (back.square().sum() + (pp * torch.arange(num_out)).sum()).backward()
        results.append((out, pp, back, t.grad, p.grad, idx % tokens.shape[0]))
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert results[1][4].abs().sum() > 0  # probs did get gradient


def test_permute_bf16_tokens_fp32_probs_promote_like_upstream():
    routing_map, probs = _routing()
    tokens = torch.randn(routing_map.shape[0], 8).to(torch.bfloat16)
    num_out = int(routing_map.sum())
    out, _, idx, _, _ = moe_utils.permute(tokens, routing_map, num_out_tokens=num_out)
    ref = moe_utils.unpermute(out, idx, tokens.shape, probs=probs, routing_map=routing_map)
    out2, _, idx2 = moe_permute.permute(tokens, routing_map, None, num_out)
    got = moe_permute.unpermute(out2, idx2, tokens.shape, probs=probs)
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


NPU_CHILD = r"""
import json, torch_npu
import adaptor
from adaptor import bootstrap, run_state
""" + EXPERTS_SETUP + r"""
from adaptor.ops import moe_permute
assert run_state.backend().name == "npu", run_state.backend()
facts = {}
torch_npu.calls.clear()
# fusion=False: megatron's jit-fused swiglu goes through torch.compile, which runs eagerly on NPU.
# bf16, the grouped kernel's dtype: the same 2 bf16 ulps as the CPU bf16 test.
ref, ours = make_pair(fusion=False, dtype=torch.bfloat16)
got_ref, got = run_both(ref, ours, [5, 0, 7, 3], dtype=torch.bfloat16)
facts["experts_bf16_close"] = all(torch.allclose(b.float(), a.float(), rtol=1.6e-2, atol=1e-2)
                                  for a, b in zip(got_ref, got))
facts["gmm"] = [[kw["split_item"], kw["group_type"], kw["group_list_type"], kw["group_list"].tolist(),
                 [list(t.shape) for t in args[0]], [list(t.shape) for t in args[1]]]
                for n, args, kw in torch_npu.calls if n == "npu_grouped_matmul"]
# fp32: npu_grouped_matmul takes fp32 only as single tensors, so one matmul per expert, exact.
torch_npu.calls.clear()
ref, ours = make_pair(fusion=False)
got_ref, got = run_both(ref, ours, [5, 0, 7, 3])
facts["experts_maxdiff"] = max((a - b).abs().max().item() for a, b in zip(got_ref, got))
facts["fp32_gmm_calls"] = sum(n == "npu_grouped_matmul" for n, _, _ in torch_npu.calls)

from megatron.core.transformer.moe import moe_utils
g = torch.Generator().manual_seed(0)
T, E, K = 11, 4, 2
top = torch.randn(T, E, generator=g).topk(K, dim=1).indices
rmap = torch.zeros(T, E, dtype=torch.bool).scatter_(1, top, True)
probs = torch.zeros(T, E).scatter_(1, top, torch.rand(T, K, generator=g))
tokens = torch.randn(T, 8, generator=g)
torch_npu.calls.clear()
res = []
for fused in (False, True):
    t, p = tokens.clone().requires_grad_(), probs.clone().requires_grad_()
    if fused:
        out, pp, idx = moe_permute.permute(t, rmap, p, T * K)
        back = moe_permute.unpermute(out * 2, idx, t.shape, probs=p)
    else:
        out, pp, idx, _, _ = moe_utils.permute(t, rmap, p, num_out_tokens=T * K)
        back = moe_utils.unpermute(out * 2, idx, t.shape, probs=p, routing_map=rmap)
    back.square().sum().backward()
    res.append([out, pp, back, p.grad])
facts["permute_maxdiff"] = max((a - b).abs().max().item() for a, b in zip(*res))
facts["perm_calls"] = [[n, [list(a.shape) for a in args], {k: (list(v.shape) if torch.is_tensor(v) else v)
                        for k, v in kw.items()}] for n, args, kw in torch_npu.calls]
print("FACTS" + json.dumps(facts))
"""


@pytest.fixture(scope="module", autouse=True)
def npu_child():
    """Started first, checked last (the final test): it runs while the other tests do."""
    env = standin_env(OMP_NUM_THREADS="1")
    env.pop("ADAPTOR_BACKEND", None)
    code = NPU_CHILD
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_npu_path_against_standin(npu_child):
    try:
        stdout, stderr = npu_child.communicate(timeout=180)
    finally:
        npu_child.kill()
    line = [ln for ln in stdout.splitlines() if ln.startswith("FACTS")]
    assert npu_child.returncode == 0 and line, stdout[-3000:] + stderr[-3000:]
    facts = json.loads(line[0][5:])
    assert facts["experts_maxdiff"] < 1e-5 and facts["fp32_gmm_calls"] == 0
    assert facts["experts_bf16_close"]
    gmm = facts["gmm"]
    # forward fc1, fc2; backward fc2 (dx, dw), fc1 (dx, dw)
    assert len(gmm) == 6, gmm
    cum = [5, 5, 12, 15]
    fwd = [c for c in gmm if c[1] == 0]
    kgrads = [c for c in gmm if c[1] == 2]
    assert len(fwd) == 4 and len(kgrads) == 2
    for split_item, group_type, glt, group_list, xs, ws in fwd:
        assert (split_item, glt, group_list) == (2, 0, cum) and len(xs) == 1 and len(ws) == 4
    assert [c[5][0] for c in fwd[:2]] == [[32, 96], [48, 32]]  # weights as [in, out]: fc1 (glu: 2*48), fc2
    for split_item, group_type, glt, group_list, xs, ws in kgrads:
        assert (split_item, glt, group_list) == (3, 0, cum) and xs[0][1] == 15 and ws[0][0] == 15
    assert facts["permute_maxdiff"] < 1e-6
    names = [c[0] for c in facts["perm_calls"]]
    assert names == ["npu_moe_token_permute", "npu_moe_token_unpermute"], names
    perm, unperm = facts["perm_calls"]
    assert perm[1] == [[11, 8], [11, 2]] and perm[2] == {"num_out_tokens": 22, "padded_mode": False}
    assert unperm[1] == [[22, 8], [22]] and unperm[2]["probs"] == [11, 2] and unperm[2]["padded_mode"] is False
