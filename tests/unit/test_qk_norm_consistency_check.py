"""``--test-mode``'s q/k-norm check works for RMSNorm (no bias) and still catches a difference.

Two gloo ranks (data parallel) run Megatron's ``SelfAttention.run_realtime_tests`` as patched, on
RMSNorm and LayerNorm q/k norms: equal parameters pass, and a k-norm weight changed on one rank is
named on both.
"""
from __future__ import annotations

from helpers.processes import two_gloo_ranks
from helpers.warm_launcher import base_env

CHILD = r"""
import torch
import torch.distributed as dist

def rank_main(rank, store, results):
    import adaptor
    from types import SimpleNamespace
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.attention import SelfAttention
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ps.initialize_model_parallel(1, 1)
    out = {}
    for norm in ("RMSNorm", "LayerNorm"):
        for differ in (False, True):
            make = getattr(torch.nn, norm)
            attn = SimpleNamespace(config=SimpleNamespace(qk_layernorm=True), q_layernorm=make(8), k_layernorm=make(8))
            if differ and rank == 1:
                with torch.no_grad():
                    attn.k_layernorm.weight[3] += 1e-3
            try:
                SelfAttention.run_realtime_tests(attn)
                out[f"{norm}-{differ}"] = "ok"
            except AssertionError as e:
                out[f"{norm}-{differ}"] = str(e)
    results[rank] = out

"""


def test_check_passes_equal_rmsnorm_and_layernorm_and_names_a_difference():
    facts = two_gloo_ranks(CHILD, env=base_env({"ADAPTOR_QUIET": "1"}))
    for rank in ("0", "1"):
        for norm in ("RMSNorm", "LayerNorm"):
            assert facts[rank][f"{norm}-False"] == "ok", facts
            assert "k_layernorm.weight differ between data-parallel ranks" in facts[rank][f"{norm}-True"], facts
            assert "q_layernorm" not in facts[rank][f"{norm}-True"], facts
