"""--moe-grouped-gemm and --moe-permute-fusion in training: a pretrain_gpt.py MoE run with both flags
reproduces the run without them.

The modules against megatron-core's own (GroupedExperts against SequentialMLP, the fused permute
against moe_utils') and the NPU path against the torch_npu stand-in: tests/unit/test_moe_fused_ops.py.
"""
from __future__ import annotations

import torch

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, tail


def test_pretrain_moe_with_both_flags_matches_without():
    from concurrent.futures import ThreadPoolExecutor

    moe = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "96",
           "--moe-aux-loss-coeff", "0.01", "--moe-token-dispatcher-type", "alltoall", "--train-iters", "5"]
    with ThreadPoolExecutor(2) as pool:  # one process each, on the two cores
        runs = pool.map(lambda extra: run_pretrain(TINY_QWEN3 + moe + extra, 1),
                        [[], ["--moe-grouped-gemm", "--moe-permute-fusion"]])
        base, fused = list(runs)
    assert base.returncode == 0 and len(base.losses) == 5, tail(base.output)
    assert fused.returncode == 0 and len(fused.losses) == 5, tail(fused.output)
    # fp32 on CPU: both paths do the same per-expert matmuls and the same
    # scatter-add order, so the curves agree to the printed 6 digits; 1e-5
    # leaves room only for matmul blocking differences, not for a wrong route.
    torch.testing.assert_close(fused.curve(), base.curve(), rtol=1e-5, atol=0)

