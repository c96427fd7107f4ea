"""Gated DeltaNet layers under tensor, context and pipeline parallelism reproduce the single-process loss curve.

The tiny Qwen3 of test_parallel_loss_curves.py with every other layer a GDN layer (the torch kernels of
adaptor.ops.gated_delta_rule: fla is not installed here), fp32, uncompiled. All runs start from one
checkpoint written by a single process and train 10 iterations on the same mock data. TP=2 splits the
GDN heads, its in/out projections, convolution channels and gate parameters; CP=2 moves each rank's
sequence chunks to whole sequences over half the heads (GDN's own all-to-alls); PP=2 gives each stage
its slice of the layer pattern. They add the same numbers in another order, so the curves agree to fp32 rounding (RTOL as in test_parallel_loss_curves.py).
"""
from __future__ import annotations

import math

import pytest

from helpers.megatron_runs import TINY_QWEN3, save_start_checkpoint, worst_relative_gap
from helpers.megatron_runs import train_from as _train_from

ITERS = 10
RTOL = 2e-5
GDN = TINY_QWEN3 + [
    "--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "2",
    "--linear-conv-kernel-dim", "4", "--linear-key-head-dim", "16", "--linear-value-head-dim", "16",
    "--linear-num-key-heads", "2", "--linear-num-value-heads", "4",
]
LAYOUTS = {
    "tp2_sequence_parallel": ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
    "cp2": ["--context-parallel-size", "2"],
    "pp2": ["--pipeline-model-parallel-size", "2"],  # each stage builds its slice of the GDN/attention pattern
}


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("gdn_start")
    save_start_checkpoint(GDN, ckpt)
    return ckpt


@pytest.fixture(scope="module")
def reference(start):
    curve = _train_from(GDN, start, ITERS).curve()
    assert all(math.isfinite(x) for x in curve)
    assert curve[-1] < curve[0], f"loss did not fall: {curve}"
    return curve


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gdn_layout_reproduces_single_process_curve(layout, start, reference):
    curve = _train_from(GDN, start, ITERS, nproc=2, extra=LAYOUTS[layout]).curve()
    worst = worst_relative_gap(curve, reference)
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}\n{curve}\n{reference}"
