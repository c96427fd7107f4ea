"""--apply-layernorm-1p in training: fused and unfused agree, init matches the plain model, the checkpoint
remembers the flag.

Three short pretrain_gpt.py launches of the tiny Qwen3 (RMSNorm, qk-layernorm: the layers', the q/k
and the final norms all zero-centred), the plain run shared with the other e2e tests:

* unfused with the flag, saving its last step, and ``--use-fused-rmsnorm`` with it, side by side;
* loading that checkpoint without the flag, which must stop in one line before training.

Per-norm forward/backward against ``(1 + gamma)`` times the plain norm: tests/unit/test_layernorm_1p.py.
"""
from __future__ import annotations

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, tail
from helpers.one_line_errors import assert_one_line_error

ITERS = ["--train-iters", "5"]
FLAG = ["--apply-layernorm-1p"]
# fused vs unfused: the same formulas in another order, fp32, as tests/e2e/test_fused_elementwise.py
# (~1e-7 per op, ~1e-6 after five Adam steps; a wrong scale such as gamma instead of 1 + gamma
# changes the first loss itself).
RTOL = 2e-5


def test_zero_centred_gamma_fused_unfused_and_against_plain(shared_runs, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    ckpt = tmp_path / "ckpt"
    save = ["--save", str(ckpt), "--save-interval", "5"]
    with ThreadPoolExecutor(3) as pool:
        plain, unfused, fused = pool.map(lambda run, args: run(args), [shared_runs.run, run_pretrain, run_pretrain],
                                         [TINY_QWEN3 + ITERS, TINY_QWEN3 + ITERS + FLAG + save,
                                          TINY_QWEN3 + ITERS + FLAG + ["--use-fused-rmsnorm"]])
    for run in (plain, unfused, fused):
        assert run.returncode == 0, tail(run.output)
        assert sorted(run.losses) == [1, 2, 3, 4, 5], tail(run.output)
    assert "fused RMSNorm: autograd function in use" in fused.output
    assert "layernorm_1p" in unfused.output
    gaps = [abs(f - u) / u for f, u in zip(fused.curve(), unfused.curve())]
    assert max(gaps) <= RTOL, (gaps, unfused.curve(), fused.curve())
    # gamma = 0 at init: the same function as the plain model with weight 1, same seed, same batch.
    assert unfused.curve()[0] == plain.curve()[0], (unfused.curve(), plain.curve())
    # After it, the model differs only in how the scale is stored (gamma = w - 1): Adam's update of a
    # parameter does not depend on its value and Megatron does not decay norms, so the curves stay
    # together up to the rounding of 1 + gamma against w.
    later = [abs(a - b) / b for a, b in zip(unfused.curve()[1:], plain.curve()[1:])]
    assert max(later) <= RTOL, (later, unfused.curve(), plain.curve())

    # What the flag changed, then: the stored norm weights are gamma, near zero after five steps of
    # lr 1e-3 (the plain model's are near one), for every norm the spec builds (input and pre-MLP
    # norms under Transformer Engine's names, as every checkpoint stores them).
    norms = norm_weights(ckpt / "iter_0000005")
    assert sorted(norms) == ["decoder.final_layernorm.weight", "decoder.layers.mlp.linear_fc1.layer_norm_weight",
                             "decoder.layers.self_attention.k_layernorm.weight",
                             "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
                             "decoder.layers.self_attention.q_layernorm.weight"], sorted(norms)
    assert all(0 < w.abs().max() < 0.05 for w in norms.values()), {k: w.abs().max() for k, w in norms.items()}
    # So without the flag they would be read as the scale itself: the resume stops in one line.
    refused = run_pretrain(TINY_QWEN3 + ["--train-iters", "6", "--load", str(ckpt)])
    assert_one_line_error(refused, ["saved with --apply-layernorm-1p, so its norms scale by 1 + weight; add the flag"],
                          torchrun=True)


def norm_weights(iteration_dir):
    """Every norm weight a --save iteration directory holds, by name (safetensors or torch_dist)."""
    from helpers.checkpoint_compare import _dcp_items, checkpoint_format

    fmt = checkpoint_format(iteration_dir)
    if fmt == "safetensors":
        from safetensors import safe_open

        items = {}
        for path in sorted(iteration_dir.glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                items.update({k: f.get_tensor(k) for k in f.keys()})
    else:
        assert fmt == "torch_dist", f"no finished checkpoint in {iteration_dir}"
        items = _dcp_items(iteration_dir)
    return {k: v for k, v in items.items()
            if not k.startswith("optimizer.") and k.endswith(("layernorm.weight", "layer_norm_weight"))}
