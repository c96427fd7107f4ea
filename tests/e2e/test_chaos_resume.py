"""Training SIGKILLed at random moments and resumed ends bit for bit where an uninterrupted run ends, dropout on.

A short version of ``benchmarks/chaos_resume.py``: each layout (two processes, the tiny Qwen3 with
dropout 0.1, 12 iterations, a checkpoint every 3, ``--ckpt-format safetensors``) is trained once
without interruption and once through one kill at a moment of its own kind, drawn from a fixed seed;
the resumed run's final checkpoint (weights, optimizer state, RNG states) and every checkpoint a
kill left must equal the uninterrupted run's, and every printed loss must too. The moments and the
checks are in tests/helpers/chaos_resume.py.
"""
from __future__ import annotations

import random

import pytest

from helpers.chaos_resume import reference_run, run_trial

# One kind of moment per layout, so that the four cover the interesting ones.
CASES = {
    "dp2_distopt": "commit_marked",
    "pp2": "in_step",
    "fsdp2": "sync_save",
    "ep2": "async_save",
}


@pytest.mark.parametrize("layout", CASES)
def test_killed_and_resumed_run_is_bit_exact(layout, tmp_path):
    ref = reference_run(layout, "safetensors", tmp_path)
    trial = run_trial(ref, tmp_path, random.Random(f"ci-{layout}"), kills=1, moments=[CASES[layout]])
    assert len(trial.kills) == 1 and trial.kills[0].landed, trial.kills
    assert trial.tensors_compared > 0
