"""Recompute leaves the loss curve where it was: Megatron's flags and MindSpeed's, alone and with parallelism.

Every run starts from one checkpoint written by a single process (PP=2 seeds its stages differently)
and trains 10 iterations of the tiny Qwen3 in fp32, dropout 0 (TINY_QWEN3 sets both dropouts to 0,
so a recompute draws no random numbers), against the same run without recompute.

Tolerance: a recompute runs the same fp32 operations on the same inputs, so the recomputed
activations are bit for bit the kept ones; what changes is the order in which some gradients are
summed (a checkpointed branch hands its input gradient back as a separate term of the residual
sum), which is fp32 rounding: measured at most 1.6e-7 relative on one process. The parallel layouts
add their own reordering (tests/e2e/test_parallel_loss_curves.py: ~1e-6). rtol 2e-5 is an order of
magnitude above both and far below the 1e-2 per iteration one wrong gradient causes. That the
recompute really happens (activations freed, then recomputed) is shown in tests/unit/test_recompute.py.
"""
from __future__ import annotations

import pytest

from helpers.megatron_runs import train_from as _train_from
from helpers.megatron_runs import (TINY_QWEN3, save_start_checkpoint, side_by_side, worst_relative_gap)
from helpers.prefetch import prefetched

ITERS = 10
RTOL = 2e-5
MINDSPEED = ["--recompute-norm", "--recompute-activation-function"]


@prefetched
def common_start(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("recompute_start")
    save_start_checkpoint(TINY_QWEN3, ckpt)
    return ckpt


def train_from(ckpt, nproc=1, extra=()):
    return _train_from(TINY_QWEN3, ckpt, ITERS, nproc, extra).curve()


# One process each. 4 layers: block 2 recomputes layers 0-1 whole, the MindSpeed flags take 2-3.
ONE_PROCESS = {
    "reference": [],
    "full_uniform": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"],
    "full_block": ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"],
    "selective_default": ["--recompute-granularity", "selective"],
    "selective_core_attn_layernorm_mlp": ["--recompute-granularity", "selective",
                                          "--recompute-modules", "core_attn", "layernorm", "mlp"],
    "recompute_norm_3_layers": ["--recompute-norm", "--recompute-norm-num-layers", "3"],
    "recompute_activation_function": ["--recompute-activation-function"],
}


@prefetched
def one_process_curves(common_start):
    names = list(ONE_PROCESS)
    curves = side_by_side(*[(lambda n=n: train_from(common_start, extra=ONE_PROCESS[n])) for n in names])
    return dict(zip(names, curves))


def assert_same_curve(curve, reference):
    worst = worst_relative_gap(curve, reference)
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}\n{curve}\n{reference}"


@pytest.mark.parametrize("setting", [n for n in ONE_PROCESS if n != "reference"])
def test_recompute_keeps_the_loss_curve(setting, one_process_curves):
    reference = one_process_curves["reference"]
    assert reference[-1] < reference[0], f"loss did not fall: {reference}"
    assert_same_curve(one_process_curves[setting], reference)


FULL_BLOCK = ["--recompute-granularity", "full", "--recompute-method", "block"]
LAYOUTS = {
    "tp2": ["--tensor-model-parallel-size", "2", *FULL_BLOCK, "--recompute-num-layers", "2", *MINDSPEED],
    # 2 layers per stage: layer 0 of each stage whole, layer 1 with the finer recomputes
    "pp2": ["--pipeline-model-parallel-size", "2", *FULL_BLOCK, "--recompute-num-layers", "1", *MINDSPEED],
    "dp2_distributed_optimizer": ["--use-distributed-optimizer", *FULL_BLOCK, "--recompute-num-layers", "1",
                                  "--recompute-norm", "--recompute-norm-num-layers", "1",
                                  "--recompute-activation-function", "--recompute-activation-function-num-layers", "2"],
    "dp2_torch_fsdp2": ["--use-torch-fsdp2", *FULL_BLOCK, "--recompute-num-layers", "2", *MINDSPEED],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_recompute_with_parallelism_keeps_the_loss_curve(layout, common_start, one_process_curves):
    curve = train_from(common_start, nproc=2, extra=LAYOUTS[layout])
    assert_same_curve(curve, one_process_curves["reference"])
