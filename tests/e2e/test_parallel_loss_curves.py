"""Tensor, pipeline and data parallelism reproduce the single-process loss curve.

Every run starts from one checkpoint written by a single process (Megatron
seeds pipeline stages differently, so fresh PP=2 weights would differ from
PP=1's) and trains 10 iterations in fp32 on the same mock data: the same
global batch of 8 sequences per iteration, split differently across ranks.

Tolerance: runs at different layouts add the same numbers in a different
order (TP splits matmuls and all-reduces partial sums, DP all-reduces
gradients), so they agree to fp32 rounding, not bit for bit. fp32 has a unit
roundoff of 6e-8; a few hundred reordered additions per value and ten Adam
steps keep the relative loss difference near 1e-6 (Megatron prints 7
significant digits). rtol=2e-5 is an order of magnitude above that, and far
below the 1e-2 difference per iteration that one wrong gradient would cause
(checked by `test_tolerance_detects_a_wrong_run`).
"""
from __future__ import annotations

import math

import pytest

from helpers.megatron_runs import train_from as _train_from
from helpers.megatron_runs import (TINY_QWEN3, run_pretrain, save_start_checkpoint, side_by_side, tail,
                                  worst_relative_gap)
from helpers.prefetch import prefetched

ITERS = 10
RTOL = 2e-5


@prefetched
def common_start(tmp_path_factory):
    """Initial weights: one iteration at lr=0 changes nothing and lets Megatron save them."""
    ckpt = tmp_path_factory.mktemp("common_start")
    save_start_checkpoint(TINY_QWEN3, ckpt)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    return ckpt


def train_from(ckpt, nproc=1, extra=(), warm=True):
    return _train_from(TINY_QWEN3, ckpt, ITERS, nproc, extra, warm=warm).curve()


@prefetched
def one_process_curves(common_start):
    """The reference and the wrong-learning-rate run: one process each, side by side."""
    reference, wrong_lr = side_by_side(lambda: train_from(common_start),
                                       lambda: train_from(common_start, extra=["--lr", "1.1e-3"]))
    return {"reference": reference, "wrong_lr": wrong_lr}


@pytest.fixture(scope="module")
def reference(one_process_curves):
    curve = one_process_curves["reference"]
    assert all(math.isfinite(x) for x in curve)
    assert curve[-1] < curve[0], f"loss did not fall: {curve}"
    return curve


def assert_same_curve(curve, reference):
    worst = worst_relative_gap(curve, reference)
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}\n{curve}\n{reference}"


LAYOUTS = {
    "tp2": ["--tensor-model-parallel-size", "2"],
    "pp2": ["--pipeline-model-parallel-size", "2"],
    "dp2": [],
    "dp2_distributed_optimizer": ["--use-distributed-optimizer"],
    # Gradient reduce-scatters start while backward runs and parameter all-gathers while the next
    # forward runs, bucket by bucket (small buckets so that there are several per step).
    "dp2_distributed_optimizer_overlap": ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                          "--overlap-param-gather", "--ddp-bucket-size", "20000"],
}


COLD = {"tp2"}  # launched by torchrun itself, as a user does (the others start warm: docs/testing.md)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_reproduces_single_process_curve(layout, common_start, reference):
    curve = train_from(common_start, nproc=2, extra=LAYOUTS[layout], warm=layout not in COLD)
    assert_same_curve(curve, reference)


# Context parallelism (no Transformer Engine): every rank holds two chunks of each sequence; the
# ring, Ulysses and hybrid attention merge partial softmaxes in another order than one process
# does, which is fp32 rounding again (the attention alone agrees to ~1e-6, tests/e2e/test_context_parallel.py).
CP_LAYOUTS = {
    "cp2_ring": (2, ["--context-parallel-size", "2", "--cp-comm-type", "p2p"]),
    "cp2_ulysses": (2, ["--context-parallel-size", "2", "--cp-comm-type", "a2a"]),
    "cp4_hybrid_2x2": (4, ["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                           "--hierarchical-context-parallel-sizes", "2", "2"]),
    "cp2_tp2_sequence_parallel": (4, ["--context-parallel-size", "2", "--tensor-model-parallel-size", "2",
                                      "--sequence-parallel"]),
    "cp2_dp2_fsdp2": (4, ["--context-parallel-size", "2", "--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]),
    "cp2_pp2": (4, ["--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    "cp2_dp2_distributed_optimizer": (4, ["--context-parallel-size", "2", "--use-distributed-optimizer"]),
}
CP_SAVE_AT = 5


@prefetched
def cp2_ring_run(common_start, tmp_path_factory):
    """The ring layout, saving at iteration 5 so that a CP=1 run can resume from it."""
    save = tmp_path_factory.mktemp("cp2_ring_save")
    nproc, extra = CP_LAYOUTS["cp2_ring"]
    curve = train_from(common_start, nproc=nproc, extra=[*extra, "--save", str(save), "--save-interval", str(CP_SAVE_AT)])
    return curve, save


@pytest.mark.parametrize("layout", CP_LAYOUTS)
def test_context_parallel_reproduces_single_process_curve(layout, common_start, cp2_ring_run, reference):
    if layout == "cp2_ring":
        curve = cp2_ring_run[0]
    else:
        nproc, extra = CP_LAYOUTS[layout]
        curve = train_from(common_start, nproc=nproc, extra=extra)
    assert_same_curve(curve, reference)


def test_checkpoint_of_a_context_parallel_run_resumes_on_one_process(cp2_ring_run, reference):
    """CP shards no weights: the CP=2 checkpoint of iteration 5 resumes at CP=1 onto the reference curve."""
    _, save = cp2_ring_run
    args = TINY_QWEN3 + ["--train-iters", str(ITERS), "--load", str(save), "--ckpt-step", str(CP_SAVE_AT)]
    run = run_pretrain(args)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(CP_SAVE_AT + 1, ITERS + 1)), tail(run.output)
    assert_same_curve(run.curve(), reference[CP_SAVE_AT:])


def test_tolerance_detects_a_wrong_run(one_process_curves, reference):
    """A run that differs in one hyperparameter (lr 1e-3 -> 1.1e-3) must fail the comparison."""
    curve = one_process_curves["wrong_lr"]
    with pytest.raises(AssertionError):
        assert_same_curve(curve, reference)
