"""Every fused-operator flag at once: the tiny Qwen3 trains to the same loss curve as without them.

Both runs start from the same initial weights (same seed; the fused modules
keep the parameter names and initialisation of the modules they replace) and
read the same batches, in fp32. What may differ is only the order of
floating-point operations inside each fused kernel (SDPA instead of
baddbmm + softmax, RMSNorm/SwiGLU/RoPE in one pass, cross-entropy by chunks),
round-off of about 1e-7 relative per operation that Adam carries forward.

Tolerance: rtol 2e-5 on every iteration's loss (the bound the parallel
loss-curve tests use). Measured: the largest gap over 10 iterations was
1.7e-7, one unit in the last printed digit. A real defect is far above it: a
1% change of the learning rate alone moves the curve by 3.5e-4 relative by
iteration 6 (``test_tolerance_catches_a_small_change`` checks it exceeds 5x
the bound).
"""
from __future__ import annotations

import math

import pytest

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, side_by_side, tail
from helpers.prefetch import prefetched

FUSED = ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-flash-attn",
         "--cross-entropy-loss-fusion"]
ITERS = ["--train-iters", "10"]
RTOL = 2e-5


def _curve(run):
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, 11)), tail(run.output)
    return run.curve()


@prefetched
def runs(shared_runs):
    """Unfused, fused, and fused with a 1% larger learning rate: three one-process runs, two at a time.

    The unfused run is the session's shared 10-iteration run (test_fused_cross_entropy.py's and
    test_training_runs.py's reference too)."""
    lr = TINY_QWEN3[TINY_QWEN3.index("--lr") + 1]
    unfused, fused, changed = side_by_side(
        lambda: shared_runs.run(TINY_QWEN3 + ITERS),
        lambda: run_pretrain(TINY_QWEN3 + ITERS + FUSED),
        lambda: run_pretrain(TINY_QWEN3 + ITERS + FUSED + ["--lr", repr(float(lr) * 1.01)]))
    return {"unfused": unfused, "fused": fused, "changed": changed}


@pytest.fixture(scope="module")
def unfused(runs):
    return _curve(runs["unfused"])


def relative_gaps(a, b):
    return [abs(x - y) / abs(y) for x, y in zip(a, b)]


def test_all_fused_flags_reproduce_the_unfused_curve(runs, unfused):
    run = runs["fused"]
    fused = _curve(run)
    assert all(math.isfinite(x) for x in fused), tail(run.output)
    for owner in ("patches.fusions.swiglu", "patches.fusions.rope", "patches.fusions.cross_entropy"):
        assert f"[megatron-adaptor]   {owner}:" in run.output, f"{owner} not applied\n{tail(run.output)}"
    assert "rmsnorm" in run.output and "flash_attention" in run.output
    gaps = relative_gaps(fused, unfused)
    assert max(gaps) < RTOL, f"max relative gap {max(gaps):.2e}\nfused   {fused}\nunfused {unfused}"


def test_tolerance_catches_a_small_change(runs, unfused):
    changed = _curve(runs["changed"])
    assert max(relative_gaps(changed, unfused)) > 5 * RTOL, changed
