"""``--optimizer muon`` with Megatron's default flags trains: tiny Qwen3, one process against data parallel 2
under Megatron's layer-wise distributed optimizer (``--use-distributed-optimizer``), the same curve.

Both runs draw the same initial weights (TP=PP=1, one seed) and see the same global batches; data
parallelism only reorders the gradient sums (a reduce-scatter instead of micro-batch accumulation), and
the layer-wise optimizer steps each whole matrix on one rank with the same Muon step, so the curves agree
up to that reordering, which Muon's bf16 Newton-Schulz may round differently: rtol 2e-4, ten times
test_parallel_loss_curves.py's fp32 one. Each run must say it built Muon (and the DP2 run the layer-wise
optimizer), so a flag that fell back to Adam fails here even though its loss would fall. Both runs save
at iteration 4 (torch_dist, Megatron's default); resuming there must continue each curve bit for bit, so
Muon's momentum buffers are saved and loaded, whole on one rank and sharded by matrix over two. The
layer-wise optimizer's older assignment (``--no-use-layer-wise-param-layout``: matrices dealt out by
size, then an all-gather of uneven sizes, which gloo needs patches/device/gloo_uneven_collectives.py for)
trains the same curve.
"""
from __future__ import annotations

import math

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, side_by_side, tail, worst_relative_gap

ITERS = 8
SAVE_AT = 4
# Megatron's default Muon flags: quintic coefficients, the per-block QKV split, bf16 Newton-Schulz.
MUON = ["--optimizer", "muon", "--muon-momentum", "0.9", "--muon-nesterov", "--lr", "2e-3", "--min-lr", "2e-4"]
BUILT = "optimizer: Megatron's Muon (adaptor.optimizers.muon) for the 2-D weight matrices, Adam for the other parameters"
LAYER_WISE = "optimizer: Megatron's layer-wise distributed optimizer"
RTOL = 2e-4  # measured 1.1e-5 over 8 iterations with the default flags (the curves fall by 0.79)


def test_muon_trains_with_falling_loss_matches_one_process_at_dp2_layer_wise_and_both_resume(tmp_path):
    run = [*TINY_QWEN3, *MUON, "--train-iters", str(ITERS)]
    layer_wise = [*run, "--use-distributed-optimizer"]
    one_dir, dp2_dir = tmp_path / "one", tmp_path / "dp2"

    def save(directory):
        return ["--save", str(directory), "--save-interval", str(SAVE_AT)]

    def resume(directory):
        return ["--load", str(directory), "--ckpt-step", str(SAVE_AT)]

    one, dp2 = side_by_side(lambda: run_pretrain(run + save(one_dir)),
                            lambda: run_pretrain(layer_wise + save(dp2_dir), nproc=2))
    for run_ in (one, dp2):
        assert run_.returncode == 0, tail(run_.output)
        assert BUILT in run_.output, tail(run_.output)
        assert sorted(run_.losses) == list(range(1, ITERS + 1)), tail(run_.output)
        curve = run_.curve()
        assert all(math.isfinite(v) for v in curve), curve
        assert curve[-1] < curve[0] - 0.5, curve
    assert LAYER_WISE in dp2.output and LAYER_WISE not in one.output, tail(dp2.output)
    assert worst_relative_gap(dp2.curve(), one.curve()) < RTOL, (dp2.curve(), one.curve())
    resumed_one, resumed_dp2, size_balanced = side_by_side(
        lambda: run_pretrain(run + resume(one_dir)),
        lambda: run_pretrain(layer_wise + resume(dp2_dir), nproc=2),
        lambda: run_pretrain(layer_wise + ["--no-use-layer-wise-param-layout"], nproc=2))
    assert size_balanced.returncode == 0, tail(size_balanced.output)
    assert worst_relative_gap(size_balanced.curve(), one.curve()) < RTOL, (size_balanced.curve(), one.curve())
    for resumed, whole in ((resumed_one, one), (resumed_dp2, dp2)):
        assert resumed.returncode == 0, tail(resumed.output)
        assert resumed.curve() == whole.curve()[SAVE_AT:], (resumed.curve(), whole.curve())
