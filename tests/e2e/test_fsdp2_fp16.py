"""``--use-torch-fsdp2 --fp16``: FSDP2 trains in fp16 with Megatron's dynamic loss scaling.

Runs (the tiny Qwen3 on mock data, 10 iterations of the same global batch of 8 sequences, dynamic
loss scale from ``--initial-loss-scale 8192`` with Megatron's default hysteresis 2):

* the reference: one process, ``--fp16`` without FSDP2, i.e. Megatron's
  ``Float16OptimizerWithFloat16Params`` (fp16 model, fp32 main parameters, its own grad scaler);
* FSDP2 over DP=2 with ``--fp16`` (fp32 master shards, gathered as fp16, reduced in fp32, our
  loss-scaled ``FP32Optimizer``), saving a ``torch_dist`` checkpoint at iteration 5;
* its resume from iteration 5, and for ``safetensors`` and ``torch_dcp`` a run that saves at 5 and
  stops there (``--exit-interval 5``) and its resume.

Why these flags make the two layouts comparable. An fp16 overflow happens in the backward of one
micro-batch, so both runs must scale each micro-batch's backward alike. With Megatron's default
loss (mean per micro-batch, divided by the number of micro-batches) one process takes 4
micro-batches of 2 sequences and DP=2 takes 2 per rank, so DP=2's backward values are twice as
large and overflow at half the scale (measured: a step skipped at iteration 3 under FSDP2 and not in
the reference). ``--calculate-per-token-loss`` makes each micro-batch's loss its token sum, the
same in both layouts, and divides by the token count only after the reduction; the reference
accumulates its gradients in fp32 (``--accumulate-allreduce-grads-in-fp32``) as FSDP2's fp32
shards do. Then the two runs see the same overflows: iterations 1 and 2 overflow at 8192 and are
skipped while the scale comes down (hysteresis 2: the second halves it), and so is iteration 5,
the one the checkpoints are saved at; the same iterations must be skipped, at the same logged loss
scales. (With 16384 iterations 1-3 and 9 are skipped, likewise in both.)

Tolerance. Both compute in fp16 from identical fp16 weights with fp32 masters and fp32 gradients;
they differ only in the order gradients are summed (a reduce-scatter over two ranks against one
process's micro-batch accumulation), so an fp32 update can round to a different fp16 weight.
Measured: 2.3e-6 relative over the logged losses (3.4e-6 from 16384). RTOL_FP16 = 5e-5 (the bf16
FSDP2 test's bound, ~15x the measurements) admits that and is far below a wrong step: one skipped step taken, or one
taken step skipped, moves the following loss by ~1e-2 (each step lowers it by 0.03-0.1 here).
Resumes continue bit for bit: the same losses, loss scales and skips as the uninterrupted run. The
checkpoint at iteration 5 follows a skipped step, so the scaler it holds has halved and used up its
hysteresis; a resume with a fresh scaler (8192, hysteresis 2) would log other scales.
"""
from __future__ import annotations

import math
import re

import pytest

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, tail, worst_relative_gap
from helpers.prefetch import prefetched

ITERS, HALF = 10, 5
RTOL_FP16 = 5e-5
FP16 = ["--fp16", "--initial-loss-scale", "8192", "--calculate-per-token-loss"]
FSDP2 = ["--use-torch-fsdp2"]
_ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \|(.*?)\n")
_FIELD = {"loss": re.compile(r"lm loss: ([0-9.Ee+-]+)"), "scale": re.compile(r"loss scale: ([0-9.]+)"),
          "skipped": re.compile(r"number of skipped iterations:\s+(\d+)")}


def iterations(output: str) -> dict[int, tuple]:
    """Iteration -> (lm loss or None when skipped, loss scale, skipped) from Megatron's log lines."""
    found = {}
    for number, line in _ITERATION.findall(output):
        fields = {name: pattern.search(line) for name, pattern in _FIELD.items()}
        skipped = int(fields["skipped"].group(1))
        loss = None if skipped or not fields["loss"] else float(fields["loss"].group(1))
        found[int(number)] = (loss, float(fields["scale"].group(1)), skipped)
    return found


def train(extra, nproc, first=1, last=ITERS):
    run = run_pretrain(TINY_QWEN3 + FP16 + ["--train-iters", str(ITERS)] + list(extra), nproc=nproc)
    assert run.returncode == 0, tail(run.output)
    logged = iterations(run.output)
    assert sorted(logged) == list(range(first, last + 1)), tail(run.output)
    assert all(math.isfinite(loss) for loss, _, _ in logged.values() if loss is not None), logged
    return run, logged


@prefetched
def reference():
    return train(["--accumulate-allreduce-grads-in-fp32"], nproc=1)


@prefetched
def fsdp2(tmp_path_factory):
    save = tmp_path_factory.mktemp("fsdp2_fp16") / "torch_dist"
    run, logged = train(FSDP2 + ["--ckpt-format", "torch_dist", "--save", str(save), "--save-interval",
                                 str(HALF)], nproc=2)
    return run, logged, save


def test_fsdp2_fp16_reproduces_the_float16_optimizer_curve_and_its_skips(reference, fsdp2):
    (_, ref), (run, ours, _) = reference, fsdp2
    assert "param_dtype=float16, reduce_dtype=float32" in run.output, tail(run.output)
    skipped = [i for i, (_, _, s) in ours.items() if s]
    assert skipped == [i for i, (_, _, s) in ref.items() if s], (ours, ref)
    assert skipped[:1] == [1] and len(skipped) < ITERS // 2, ours  # the initial scale overflowed, then it trained
    assert [scale for _, scale, _ in ours.values()] == [scale for _, scale, _ in ref.values()], (ours, ref)
    assert min(scale for _, scale, _ in ours.values()) < 8192, ours  # the scale came down
    taken = [i for i in ours if ours[i][0] is not None]
    gap = worst_relative_gap([ours[i][0] for i in taken], [ref[i][0] for i in taken])
    print(f"max relative loss difference {gap:.2e} (tolerance {RTOL_FP16}); skipped iterations {skipped}")
    assert gap <= RTOL_FP16, (gap, ours, ref)
    assert ours[taken[-1]][0] < ours[taken[0]][0] - 0.1, ours


def test_resume_from_torch_dist_continues_exactly(fsdp2):
    _, full, save = fsdp2
    (save / "latest_checkpointed_iteration.txt").write_text(str(HALF))  # the run also saved iteration 10
    _, resumed = train(FSDP2 + ["--ckpt-format", "torch_dist", "--load", str(save)], nproc=2, first=HALF + 1)
    assert resumed == {i: full[i] for i in range(HALF + 1, ITERS + 1)}, (resumed, full)


@pytest.mark.parametrize("ckpt_format", ["safetensors", "torch_dcp"])
def test_resume_from_other_formats_continues_exactly(fsdp2, ckpt_format, tmp_path):
    """The scaler state travels in each format FSDP2 saves; a fresh scaler (8192, hysteresis 2) would log another scale."""
    _, full, _ = fsdp2
    flags = FSDP2 + ["--ckpt-format", ckpt_format]
    train(flags + ["--save", str(tmp_path), "--save-interval", str(HALF), "--exit-interval", str(HALF)], nproc=2,
          last=HALF)
    _, resumed = train(flags + ["--load", str(tmp_path)], nproc=2, first=HALF + 1)
    assert resumed == {i: full[i] for i in range(HALF + 1, ITERS + 1)}, (resumed, full)
