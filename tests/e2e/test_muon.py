"""``--optimizer muon`` with Megatron's default flags trains: tiny Qwen3, data parallel 2 against one process, the same curve.

Both runs draw the same initial weights (TP=PP=1, one seed) and see the same global batches; data
parallelism only reorders the gradient sums (all-reduce instead of micro-batch accumulation), so the
curves agree up to that reordering, which Muon's bf16 Newton-Schulz may round differently: rtol 2e-4,
ten times test_parallel_loss_curves.py's fp32 one. Each run must say it built Muon, so
a flag that fell back to Adam fails here even though its loss would fall. The one-process run saves
at iteration 4 (torch_dist, Megatron's default); resuming there must continue its curve bit for bit,
so Muon's momentum buffers are saved and loaded.
"""
from __future__ import annotations

import math

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, side_by_side, tail, worst_relative_gap

ITERS = 8
SAVE_AT = 4
# Megatron's default Muon flags: quintic coefficients, the per-block QKV split, bf16 Newton-Schulz.
MUON = ["--optimizer", "muon", "--muon-momentum", "0.9", "--muon-nesterov", "--lr", "2e-3", "--min-lr", "2e-4"]
BUILT = "optimizer: Megatron's Muon (adaptor.optimizers.muon) for the 2-D weight matrices, Adam for the other parameters"
RTOL = 2e-4  # measured 1.1e-5 over 8 iterations with the default flags (the curves fall by 0.79)


def test_muon_trains_with_falling_loss_matches_one_process_at_dp2_and_resumes(tmp_path):
    run = [*TINY_QWEN3, *MUON, "--train-iters", str(ITERS)]
    save = ["--save", str(tmp_path), "--save-interval", str(SAVE_AT)]
    one, dp2 = side_by_side(lambda: run_pretrain(run + save), lambda: run_pretrain(run, nproc=2))
    resumed = run_pretrain(run + ["--load", str(tmp_path), "--ckpt-step", str(SAVE_AT)])
    for run in (one, dp2):
        assert run.returncode == 0, tail(run.output)
        assert BUILT in run.output, tail(run.output)
        assert sorted(run.losses) == list(range(1, ITERS + 1)), tail(run.output)
        curve = run.curve()
        assert all(math.isfinite(v) for v in curve), curve
        assert curve[-1] < curve[0] - 0.5, curve
    assert worst_relative_gap(dp2.curve(), one.curve()) < RTOL, (dp2.curve(), one.curve())
    assert resumed.returncode == 0, tail(resumed.output)
    assert resumed.curve() == one.curve()[SAVE_AT:], (resumed.curve(), one.curve())
