"""``--optimizer-cpu-offload``: the same training with part or all of Adam's state in host memory.

Every run starts from one checkpoint (as in test_parallel_loss_curves.py) and trains fp32 unless
said otherwise. Tolerances:

* bit for bit against the same layout without offload: the host part runs the torch Adam kernel
  the parameter group selects (the loop, or the fused kernel) on CPU tensors, which is also what the
  device optimizer runs on the CPU backend; the kernel works parameter by parameter on the same fp32
  values (gradients are copied, not recomputed), so nothing is reordered;
* rtol 2e-5 against the one-process reference for TP2 x PP2: the layout reorders sums (see
  test_parallel_loss_curves.py for that tolerance), the offload adds nothing to it.

Each offloaded run must say how many elements its first step updated in host memory, so a flag
that did nothing fails here even though its curve would match.
"""
from __future__ import annotations

import re

from helpers.megatron_runs import train_from as _train_from
from helpers.megatron_runs import (TINY_QWEN3, save_start_checkpoint, side_by_side, tail,
                                  worst_relative_gap)
from helpers.prefetch import prefetched

ITERS = 10
SAVE_AT = 5
RTOL = 2e-5
HOST_LINE = re.compile(r"optimizer offload: the first step updated (\d+) of rank 0's (\d+) optimizer elements "
                       r"in host memory")


def offload(fraction):
    return ["--optimizer-cpu-offload", "--optimizer-offload-fraction", str(fraction)]


@prefetched
def common_start(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("offload_start")
    save_start_checkpoint(TINY_QWEN3, ckpt)
    return ckpt


def train(ckpt, nproc=1, extra=(), first=1, resume=False):
    extra = (["--ckpt-step", str(SAVE_AT)] if resume else []) + list(extra)
    return _train_from(TINY_QWEN3, ckpt, ITERS, nproc, extra, first=first, resume=resume)


def host_share(run) -> float:
    """The share of rank 0's optimizer elements its first step updated in host memory."""
    found = HOST_LINE.search(run.output)
    assert found, "no host step reported:\n" + tail(run.output)
    return int(found[1]) / int(found[2])


@prefetched
def fp32_runs(common_start, tmp_path_factory):
    """Reference and full offload (saving at 5); then resumes from that checkpoint with and without offload."""
    save = tmp_path_factory.mktemp("offload_save")
    reference, full = side_by_side(
        lambda: train(common_start),
        lambda: train(common_start, extra=[*offload(1.0), "--save", str(save), "--save-interval", str(SAVE_AT)]))
    with_offload, without = side_by_side(
        lambda: train(save, extra=offload(0.5), first=SAVE_AT + 1, resume=True),
        lambda: train(save, first=SAVE_AT + 1, resume=True))
    return {"reference": reference, "full": full, "resumed_half": with_offload, "resumed_plain": without}


def test_full_offload_is_bit_exact_to_no_offload(fp32_runs):
    assert host_share(fp32_runs["full"]) == 1.0
    assert fp32_runs["full"].curve() == fp32_runs["reference"].curve()


def test_resume_with_half_offload_continues_bit_exactly(fp32_runs):
    """The offloaded checkpoint of iteration 5 resumes (state from the host, half of it back there)."""
    resumed = fp32_runs["resumed_half"]
    assert 0.3 < host_share(resumed) < 0.7
    assert resumed.curve() == fp32_runs["full"].curve()[SAVE_AT:]


def test_offloaded_checkpoint_loads_without_offload(fp32_runs):
    """torch's state layout: a run without offload resumes from it onto the same curve."""
    resumed = fp32_runs["resumed_plain"]
    assert not HOST_LINE.search(resumed.output)
    assert resumed.curve() == fp32_runs["full"].curve()[SAVE_AT:]


def test_tensor_and_pipeline_parallel_with_offload_match_one_process(common_start, fp32_runs):
    run = train(common_start, nproc=4, extra=["--tensor-model-parallel-size", "2",
                                              "--pipeline-model-parallel-size", "2", *offload(0.5)])
    assert 0.3 < host_share(run) < 0.7
    worst = worst_relative_gap(run.curve(), fp32_runs["reference"].curve())
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}"


def test_bf16_distributed_optimizer_with_offload_is_bit_exact(common_start):
    """Float16 main params as shard views, overlapped grad reduce, DP2: with and without offload."""
    bf16 = ["--bf16", "--use-distributed-optimizer", "--overlap-grad-reduce"]
    with_offload, without = side_by_side(lambda: train(common_start, nproc=2, extra=[*bf16, *offload(0.5)]),
                                         lambda: train(common_start, nproc=2, extra=bf16))
    assert 0.3 < host_share(with_offload) < 0.7
    assert with_offload.curve() == without.curve()


def test_fp32_distributed_optimizer_with_full_offload_trains(common_start, fp32_runs):
    """fp32 under the distributed optimizer: Megatron steps the parameters through views of them (non-leaf
    tensors). Within RTOL of the reference: the distributed optimizer may sum the gradient norm in another order."""
    run = train(common_start, extra=["--use-distributed-optimizer", *offload(1.0)])
    assert host_share(run) == 1.0
    worst = worst_relative_gap(run.curve(), fp32_runs["reference"].curve())
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}"
