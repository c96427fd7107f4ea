"""FSDP2 (``--use-torch-fsdp2``) trains like DDP while each rank holds 1/N of the model state.

Runs (all 10 iterations of the tiny Qwen3 on mock data through torchrun/gloo, the same global
batch of 8 sequences per iteration; every pair starts from the same weights because each rank
builds the model from the same seed before it is wrapped):

* DP=2 DDP and DP=2 FSDP2 (default plan), untied embeddings, dropout 0.1 (so the recompute run
  below is checked against the random numbers too); both report their model-state bytes;
* DP=2 FSDP2 with a YAML that turns on everything else at once: CPU offload,
  reshard_after_forward false, forward prefetch of 2 units, recomputation of layers 0-2, and
  two ignored (replicated) modules — the final norm and layer 3's QKV projection;
* DP=2 DDP and DP=2 FSDP2 with ``--bf16``;
* TP=2 DDP (2 processes) and TP=2 x FSDP2 DP=2 (4 processes), tied embeddings (the default plan
  then leaves the shared weight to the root unit).

Tolerance. fp32: FSDP2 reduce-scatters gradients where DDP all-reduces them, so the same
numbers are added in a different order; fp32's unit roundoff is 6e-8 and a few hundred
reordered additions per value over ten Adam steps keep the loss within ~1e-6 relative
(measured: 1.7e-7 for the default plan, the YAML variants and TP=2 x FSDP2 alike). RTOL_FP32 =
2e-5, the project's fp32 tolerance, is an order above that and below what a real fault gives:
leaving an ignored module's gradient unreduced moved the loss by 1.4e-4 by iteration 3, and the
same run in bf16 (``test_fp32_tolerance_rejects_the_bf16_run``) differs by 1.0e-4.

bf16: both runs compute in bf16 from identical bf16 weights and keep fp32 master weights and
fp32 gradient reduction; they differ only where an fp32 update, summed in a different order,
rounds to a different bf16 weight. Measured 6.1e-6 over these 10 iterations. Rounding every
gradient reduction to bf16 (``reduce_dtype: bf16``) moves the curve by 3.7e-5, computing in fp32
instead of bf16 by 1.0e-4. RTOL_BF16 = 5e-5 is eight times the measured gap and admits
reduction-order rounding of that size; that the run computes in bf16 at all is checked
separately: its curve must be at least five times closer to bf16 DDP than to fp32 DDP.

Bad configurations through pretrain_gpt.py are one line. The YAML reader, the argument checks and
the module-name patterns in this process: tests/unit/test_torch_fsdp2.py.
"""
from __future__ import annotations

import math
import re

import pytest

from helpers.megatron_runs import ROOT, TINY_QWEN3, TwoAtATime, run_pretrain, tail, worst_relative_gap
from helpers.one_line_errors import error_lines, run_python
from helpers.prefetch import prefetched

ITERS = 10
RTOL_FP32 = 2e-5
RTOL_BF16 = 5e-5
UNTIED = ["--untie-embeddings-and-output-weights", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
FSDP2 = ["--use-torch-fsdp2"]
REPORT = {"ADAPTOR_REPORT_MEMORY": "1"}
VARIANTS_YAML = """\
sub_modules_to_wrap: ["embedding", "decoder.layers.{*}", "output_layer"]
offload_to_cpu: true
reshard_after_forward: false
num_to_forward_prefetch: 2
recompute_modules: ["decoder.layers.{0-2}"]
ignored_modules: ["decoder.final_layernorm", "decoder.layers.3.self_attention.linear_qkv"]
"""
_STATE = re.compile(r"model state rank (\d+): parameters (\d+), gradients (\d+), optimizer (\d+), total (\d+) bytes")


def train(extra, nproc=2, env=None, launch=run_pretrain):
    run = launch(TINY_QWEN3 + ["--train-iters", str(ITERS)] + list(extra), nproc=nproc, env=env)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, ITERS + 1)), tail(run.output)
    assert all(math.isfinite(x) for x in run.curve()), run.curve()
    return run


def worst_gap(curve, reference) -> float:
    return worst_relative_gap(curve, reference)


def assert_same_curve(curve, reference, rtol):
    gap = worst_gap(curve, reference)
    print(f"max relative loss difference {gap:.2e} (tolerance {rtol})")
    assert gap <= rtol, f"max relative difference {gap:.2e} > {rtol}\n{curve}\n{reference}"


def model_state(run) -> dict[int, dict[str, int]]:
    found = {int(r): dict(zip(("parameters", "gradients", "optimizer", "total"), map(int, v)))
             for r, *v in _STATE.findall(run.output)}
    assert sorted(found) == [0, 1], tail(run.output)
    return found


# ----------------------------------------------------------------------------- runs
@prefetched
def ddp():
    return train(UNTIED, env=REPORT)


@prefetched
def fsdp2():
    return train(UNTIED + FSDP2, env=REPORT)


@prefetched
def ddp_bf16():
    return train(UNTIED + ["--bf16"])


@prefetched
def fsdp2_bf16():
    return train(UNTIED + FSDP2 + ["--bf16"])


# ----------------------------------------------------------------------------- curves
def test_fsdp2_reproduces_the_ddp_curve_in_fp32(ddp, fsdp2):
    assert "features:" in fsdp2.output and "torch_fsdp2" in fsdp2.output
    assert ("fsdp2: mesh cpu x2, units [embedding, decoder.layers.0, decoder.layers.1, decoder.layers.2, "
            "decoder.layers.3, output_layer] + root") in fsdp2.output, tail(fsdp2.output)
    assert fsdp2.curve()[-1] < fsdp2.curve()[0] - 0.1, fsdp2.curve()
    assert_same_curve(fsdp2.curve(), ddp.curve(), RTOL_FP32)


def test_model_state_per_rank_is_half_of_ddp(ddp, fsdp2):
    """Parameters, gradients and Adam state each rank holds, counted from the local tensors."""
    full, sharded = model_state(ddp), model_state(fsdp2)
    for rank in (0, 1):
        for kind in ("parameters", "gradients", "optimizer"):
            ratio = sharded[rank][kind] / full[rank][kind]
            # 1/2 exactly when every tensor's first dimension is even; FSDP2 pads odd ones.
            assert 0.5 <= ratio < 0.52, (rank, kind, sharded[rank], full[rank])
    # fp32 Adam: 4 bytes of parameter, 4 of gradient, 8 of state per parameter.
    assert full[0]["optimizer"] == pytest.approx(2 * full[0]["parameters"], rel=1e-4)


def test_offload_no_reshard_prefetch_recompute_ignored_give_the_same_losses(ddp, tmp_path):
    config = tmp_path / "fsdp2.yaml"
    config.write_text(VARIANTS_YAML)
    run = train(UNTIED + FSDP2 + ["--fsdp2-config-path", str(config)])
    assert ("ignored [decoder.layers.3.self_attention.linear_qkv, decoder.final_layernorm], recomputed "
            "[decoder.layers.0, decoder.layers.1, decoder.layers.2], reshard_after_forward=False, "
            "param_dtype=float32, reduce_dtype=float32, offload_to_cpu=True, num_to_forward_prefetch=2"
            ) in run.output, tail(run.output)
    assert_same_curve(run.curve(), ddp.curve(), RTOL_FP32)


def test_bf16_fsdp2_tracks_bf16_ddp(ddp, ddp_bf16, fsdp2_bf16):
    """Mixed precision: bf16 compute, fp32 master shards and fp32 reduction; Megatron's FP32Optimizer."""
    assert re.search(r"Setting up optimizer with config OptimizerConfig\(.*\bbf16=False", fsdp2_bf16.output)
    assert re.search(r"Setting up optimizer with config OptimizerConfig\(.*\bbf16=True", ddp_bf16.output)
    assert "param_dtype=bfloat16, reduce_dtype=float32" in fsdp2_bf16.output, tail(fsdp2_bf16.output)
    assert fsdp2_bf16.curve()[-1] < fsdp2_bf16.curve()[0] - 0.1
    assert_same_curve(fsdp2_bf16.curve(), ddp_bf16.curve(), RTOL_BF16)
    # Closer to bf16 DDP than to fp32 DDP by a clear factor (measured 4.1x with torch 2.15, 5x+ with 2.14):
    # the gap to bf16 DDP is reduction order, the gap to fp32 is bf16 rounding itself.
    assert worst_gap(fsdp2_bf16.curve(), ddp_bf16.curve()) < worst_gap(fsdp2_bf16.curve(), ddp.curve()) / 3


def test_fp32_tolerance_rejects_the_bf16_run(ddp, fsdp2_bf16):
    """A run that is slightly wrong for fp32 (the same model computed in bf16) must fail the fp32 check."""
    with pytest.raises(AssertionError):
        assert_same_curve(fsdp2_bf16.curve(), ddp.curve(), RTOL_FP32)


def test_tensor_parallel_times_fsdp2_with_tied_embeddings(shared_runs):
    """TP=2 inside, FSDP2 over DP=2: four processes match TP=2 DDP; the tied weight stays in the root."""
    tp2 = ["--tensor-model-parallel-size", "2"]
    reference = train(tp2, launch=shared_runs.run)  # test_fused_cross_entropy.py's TP=2 reference too
    run = train(tp2 + FSDP2, nproc=4)
    assert "units [decoder.layers.0, decoder.layers.1, decoder.layers.2, decoder.layers.3] + root" in run.output
    assert_same_curve(run.curve(), reference.curve(), RTOL_FP32)


# ----------------------------------------------------------------------------- bad configurations
def assert_one_error_line(returncode, output, *words):
    lines = error_lines(output)
    assert returncode != 0 and len(lines) == 1, tail(output)
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in output, tail(output)


BAD_CONFIGURATIONS = ['sub_module_to_wrap: ["decoder.layers.{*}"]\n', 'sub_modules_to_wrap: ["decoder.layer.{*}"]\n',
                      'sub_modules_to_wrap: ["embedding"]\n']


@pytest.fixture(scope="module")
def bad_configuration_runs(tmp_path_factory):
    """YAML text -> Future of its one-process run; started together, two at a time, each test waits for its own."""
    def job(yaml_text):
        config = tmp_path_factory.mktemp("bad_configuration") / "fsdp2.yaml"
        config.write_text(yaml_text)
        return lambda: run_python(TINY_QWEN3 + ["--train-iters", "1", "--use-torch-fsdp2", "--fsdp2-config-path",
                                                str(config)], ROOT)

    pool = TwoAtATime()
    yield pool.start({text: job(text) for text in BAD_CONFIGURATIONS})
    pool.close()


@pytest.mark.parametrize("yaml_text, words", [
    ('sub_module_to_wrap: ["decoder.layers.{*}"]\n', ["unknown key 'sub_module_to_wrap'"]),
    ('sub_modules_to_wrap: ["decoder.layer.{*}"]\n', ["sub_modules_to_wrap", "'decoder.layer.{*}'",
                                                      "matches no module"]),
    ('sub_modules_to_wrap: ["embedding"]\n', ["'embedding'", "tied embeddings"]),
], ids=["unknown_key", "glob_matches_nothing", "tied_weight_in_a_unit"])
def test_bad_configuration_is_one_line(bad_configuration_runs, yaml_text, words):
    """Through pretrain_gpt.py: a YAML error at argument validation, two more when the model is wrapped."""
    # yaml_text in a file, then run_python(TINY_QWEN3 + ["--train-iters", "1", "--use-torch-fsdp2",
    #                                      "--fsdp2-config-path", config], ROOT)
    proc = bad_configuration_runs[yaml_text].result()
    assert_one_error_line(proc.returncode, proc.stdout + proc.stderr, *words)
