"""--use-fused-rmsnorm, --use-fused-swiglu, --use-fused-rotary-pos-emb in training: the loss curve is unchanged.

One short pretrain_gpt.py run with all three flags reproduces the loss curve of the run without
them, and says which fused kernels it used. Each op against megatron-core's unfused code, and the
NPU path against the torch_npu stand-in: tests/unit/test_fused_elementwise.py.
"""
from __future__ import annotations

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, tail

FLAGS = ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb"]


# ----------------------------------------------------------------------------- whole model
# fp32 on CPU, same seed, same batches: the fused ops compute the same formulas in another
# order (~1e-7 relative per op). Over 5 steps Adam carries that to ~1e-6 at most; the printed
# losses have 7 significant digits, so they agree to the last digit or one unit of it. rtol 2e-5
# still leaves margin, and is ~50x below what a wrong op gives (a lr 1% off moves step 5's
# loss by > 1e-3 relative on this model, see test_fused_whole_model.py).
RTOL = 2e-5


def test_pretrain_loss_curve_unchanged_by_fused_elementwise_flags(shared_runs):
    from concurrent.futures import ThreadPoolExecutor

    iters = ["--train-iters", "5"]
    with ThreadPoolExecutor(2) as pool:  # two single-process runs side by side (the plain one shared, see conftest)
        plain, fused = pool.map(lambda run, args: run(args), [shared_runs.run, run_pretrain],
                                [TINY_QWEN3 + iters, TINY_QWEN3 + iters + FLAGS])
    for run in (plain, fused):
        assert run.returncode == 0, tail(run.output)
        assert sorted(run.losses) == [1, 2, 3, 4, 5], tail(run.output)
    gaps = [abs(f - p) / p for f, p in zip(fused.curve(), plain.curve())]
    assert max(gaps) <= RTOL, (gaps, plain.curve(), fused.curve())
    out = fused.output
    assert "rmsnorm, swiglu, rope" in out
    assert "patches.fusions.swiglu: megatron.core.fusions.fused_bias_swiglu.{bias_swiglu_impl,weighted_bias_swiglu_impl}" in out
    assert ("patches.fusions.rope: megatron.core.models.common.embeddings.rope_utils."
            "{fused_apply_rotary_pos_emb,fused_apply_rotary_pos_emb_thd}") in out
    # The fused kernels really ran (each says so on first use); the plain run used none.
    for op in ("RMSNorm", "SwiGLU", "RoPE"):
        assert f"[megatron-adaptor] fused {op}: autograd function in use" in out
        assert f"fused {op}" not in plain.output
