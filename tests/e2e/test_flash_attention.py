"""--use-flash-attn in training: the tiny Qwen3's loss curve with and without it, on one process and at TP=2.

FlashAttention module by module against DotProductAttention (CPU and the NPU stand-in):
tests/unit/test_flash_attention.py.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, tail, worst_relative_gap
from helpers.prefetch import prefetched


# ----------------------------------------------------------------------------- training runs
ITERS = 5
# fp32 throughout; both runs compute the same attention with sums in another order, so the loss
# curves agree to fp32 rounding amplified over 5 Adam steps (~1e-6 relative; Megatron prints 7
# digits). rtol=2e-5 is 10x that and far below the 1e-2 a wrong mask or scale causes after one
# step. (TP=2 is compared with TP=2: a fresh TP=2 model is initialized differently.)
RTOL = 2e-5


def _train(extra, nproc=1, launch=run_pretrain):
    run = launch(TINY_QWEN3 + ["--train-iters", str(ITERS), *extra], nproc=nproc)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, ITERS + 1)), tail(run.output)
    return run


@prefetched
def runs(shared_runs):
    """Without and with --use-flash-attn, on 1 process and on TP=2 (2 processes); two at a time.

    With them, Transformer Engine's spelling (--transformer-impl transformer_engine --attention-backend flash)
    at TP=2, which this backend maps onto --use-flash-attn.

    The one-process run without the flag is the session's shared 5-iteration run (test_fused_elementwise.py's too).
    """
    tp2 = ["--tensor-model-parallel-size", "2"]
    with ThreadPoolExecutor(2) as pool:
        ref, flash = pool.submit(_train, [], 1, shared_runs.run), pool.submit(_train, ["--use-flash-attn"])
        ref_tp2, flash_tp2 = pool.submit(_train, tp2, 2), pool.submit(_train, ["--use-flash-attn", *tp2], 2)
        te = pool.submit(_train, ["--transformer-impl", "transformer_engine", "--attention-backend", "flash", *tp2], 2)
        return {"1": (ref.result(), flash.result()), "tp2": (ref_tp2.result(), flash_tp2.result()),
                "te_spelling": te.result()}


def _assert_close(curve, reference):
    worst = worst_relative_gap(curve, reference)
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}\n{curve}\n{reference}"


@pytest.mark.parametrize("layout", ["1", "tp2"])
def test_flash_attn_reproduces_loss_curve(runs, layout):
    ref, flash = runs[layout]
    assert "flash_attention" in flash.output.split("features:")[1].splitlines()[0]
    assert "flash_attention" not in ref.output.split("features:")[1].splitlines()[0]
    assert ref.curve()[-1] < ref.curve()[0]
    _assert_close(flash.curve(), ref.curve())


def test_attention_backend_flash_trains_through_flash_attention(runs):
    """TE's command line runs here: the flag maps onto our FlashAttention, printed, and trains the same model."""
    te, (_, flash_tp2) = runs["te_spelling"], runs["tp2"]
    assert "--attention-backend flash: FlashAttention (--use-flash-attn)" in te.output, tail(te.output)
    assert "transformer_impl=local (for --transformer-impl transformer_engine" in te.output, tail(te.output)
    assert "flash_attention" in te.output.split("features:")[1].splitlines()[0]
    assert te.curve()[-1] < te.curve()[0]
    assert te.curve() == flash_tp2.curve()  # the same command line once mapped: the same numbers
