"""Training SIGKILLed at random moments and resumed ends bit for bit where an uninterrupted run ends, dropout on.

A short version of ``benchmarks/chaos_resume.py``: each layout (two processes, the tiny Qwen3 with
dropout 0.1, 12 iterations, a checkpoint every 3) and each sharded format (``--ckpt-format
safetensors``, and Megatron's default ``torch_dist``) is trained once without interruption (all of
them ahead of the trials, as one prefetched fixture) and once through one kill at a moment of its
own kind, drawn from a fixed seed; the resumed run's final
checkpoint (weights, optimizer state incl. Adam's step, RNG states) and every checkpoint a kill left
must equal the uninterrupted run's, and every printed loss must too. The moments and the checks are
in tests/helpers/chaos_resume.py.

A killed *worker*: the real torchrun command line (``python -m torch.distributed.run --max-restarts 1
--rdzv-backend c10d``), cold, one launcher of two workers or two launchers of one; one worker is
SIGKILLed and torchrun alone brings the run back from the latest checkpoint, to the same losses and
final checkpoint.
"""
from __future__ import annotations

import random

import pytest

from helpers.chaos_resume import reference_run, run_trial, run_worker_kill
from helpers.prefetch import prefetched

# One kind of moment per layout and format, so that together they cover the interesting ones; a
# torch_dist kill always follows a finished save, so the resume reads the format back.
CASES = {
    ("dp2_distopt", "safetensors"): "commit_marked",
    ("pp2", "safetensors"): "in_step",
    ("fsdp2", "safetensors"): "sync_save",
    ("ep2", "safetensors"): "async_save",
    ("dp2_distopt", "torch_dist"): "sync_save",
    ("pp2", "torch_dist"): "between_steps",
    ("fsdp2", "torch_dist"): "in_step",
    ("ep2", "torch_dist"): "sync_save",
}


@prefetched
def references(tmp_path_factory):
    """The uninterrupted runs, ahead of the trials (a failed one is raised to every case)."""
    workdir = tmp_path_factory.mktemp("chaos-references")
    return {case: reference_run(*case, workdir) for case in CASES}


@pytest.mark.parametrize("layout, fmt", CASES, ids=[f"{layout}-{fmt}" for layout, fmt in CASES])
def test_killed_and_resumed_run_is_bit_exact(layout, fmt, references, tmp_path):
    ref = references[layout, fmt]
    trial = run_trial(ref, tmp_path, random.Random(f"ci-{layout}" + ("" if fmt == "safetensors" else f"-{fmt}")),
                      kills=1, moments=[CASES[layout, fmt]])
    assert len(trial.kills) == 1 and trial.kills[0].landed, trial.kills
    assert trial.tensors_compared > 0


# (launchers, moment, iteration, victim: the local rank on one launcher, the launcher of two)
WORKER_KILLS = {
    "one-launcher-in-step": (1, "in_step", 7, 1),
    "two-launchers-sync-save": (2, "sync_save", 6, 1),
}


@pytest.mark.parametrize("case", WORKER_KILLS)
def test_a_killed_worker_comes_back_under_torchrun_bit_exact(case, references, tmp_path):
    nodes, moment, iteration, victim = WORKER_KILLS[case]
    kill = run_worker_kill(references["dp2_distopt", "safetensors"], tmp_path, random.Random(f"ci-worker-{case}"),
                           moment, nodes=nodes, victim=victim, iteration=iteration)
    # in step 8: the checkpoint of 6; during the save of 6: that one if its commit was reached, else 3's
    assert kill.resumed_from in ((6,) if moment == "in_step" else (3, 6)), kill
