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
"""
from __future__ import annotations

import argparse
import math
import re

import pytest

from adaptor.backend import Backend
from adaptor.features import ArgumentError, FeatureContext
from adaptor.fsdp2.config import KEYS, Fsdp2ConfigError, load_config, resolve_config
from adaptor.fsdp2.patterns import compile_pattern
from megatron_runs import ROOT, TINY_QWEN3, run_pretrain, tail
from patches.fsdp2.torch_fsdp2 import TorchFsdp2
from test_bad_input import error_lines, run_python

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


def train(extra, nproc=2, env=None):
    run = run_pretrain(TINY_QWEN3 + ["--train-iters", str(ITERS)] + list(extra), nproc=nproc, env=env)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, ITERS + 1)), tail(run.output)
    assert all(math.isfinite(x) for x in run.curve()), run.curve()
    return run


def worst_gap(curve, reference) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(curve, reference))


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
@pytest.fixture(scope="module")
def ddp():
    return train(UNTIED, env=REPORT)


@pytest.fixture(scope="module")
def fsdp2():
    return train(UNTIED + FSDP2, env=REPORT)


@pytest.fixture(scope="module")
def ddp_bf16():
    return train(UNTIED + ["--bf16"])


@pytest.fixture(scope="module")
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


def test_tensor_parallel_times_fsdp2_with_tied_embeddings():
    """TP=2 inside, FSDP2 over DP=2: four processes match TP=2 DDP; the tied weight stays in the root."""
    tp2 = ["--tensor-model-parallel-size", "2"]
    reference = train(tp2)
    run = train(tp2 + FSDP2, nproc=4)
    assert "units [decoder.layers.0, decoder.layers.1, decoder.layers.2, decoder.layers.3] + root" in run.output
    assert_same_curve(run.curve(), reference.curve(), RTOL_FP32)


# ----------------------------------------------------------------------------- bad configurations
def assert_one_error_line(returncode, output, *words):
    lines = error_lines(output)
    assert returncode != 0 and len(lines) == 1, tail(output)
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in output, tail(output)


@pytest.mark.parametrize("yaml_text, words", [
    ('sub_module_to_wrap: ["decoder.layers.{*}"]\n', ["unknown key 'sub_module_to_wrap'"]),
    ('sub_modules_to_wrap: ["decoder.layer.{*}"]\n', ["sub_modules_to_wrap", "'decoder.layer.{*}'",
                                                      "matches no module"]),
    ('sub_modules_to_wrap: ["embedding"]\n', ["'embedding'", "tied embeddings"]),
], ids=["unknown_key", "glob_matches_nothing", "tied_weight_in_a_unit"])
def test_bad_configuration_is_one_line(tmp_path, yaml_text, words):
    """Through pretrain_gpt.py: a YAML error at argument validation, two more when the model is wrapped."""
    config = tmp_path / "fsdp2.yaml"
    config.write_text(yaml_text)
    proc = run_python(TINY_QWEN3 + ["--train-iters", "1", "--use-torch-fsdp2", "--fsdp2-config-path", str(config)],
                      ROOT)
    assert_one_error_line(proc.returncode, proc.stdout + proc.stderr, *words)


# In-process checks of the same code the runs above go through: the YAML reader and the
# feature's argument validation (each is one line naming the key or flag).
BAD_YAML = {
    "not_a_list": ("sub_modules_to_wrap: decoder.layers.{*}\n", "sub_modules_to_wrap must be a list"),
    "not_strings": ("ignored_modules: [1, 2]\n", "ignored_modules must be a list"),
    "bad_brace": ('recompute_modules: ["decoder.layers.{1-x}"]\n', "recompute_modules: 'decoder.layers.{1-x}'"),
    "backwards_range": ('recompute_modules: ["decoder.layers.{3-1}"]\n', "range 3-1 runs backwards"),
    "unbalanced": ('ignored_modules: ["decoder.layers.{0"]\n', "unbalanced brace"),
    "reshard_int": ("reshard_after_forward: 2\n", "reshard_after_forward must be true or false"),
    "param_dtype": ("param_dtype: int8\n", "param_dtype must be one of bf16, fp32"),
    "fp16": ("reduce_dtype: fp16\n", "reduce_dtype fp16 is not supported"),
    "prefetch": ("num_to_forward_prefetch: -1\n", "num_to_forward_prefetch must be a non-negative integer"),
    "offload": ("offload_to_cpu: yes please\n", "offload_to_cpu must be true or false"),
    "not_mapping": ("- a\n- b\n", "must be a mapping"),
    "syntax": ("sub_modules_to_wrap: [a, b\n", "not valid YAML at line"),
}


@pytest.mark.parametrize("name", BAD_YAML)
def test_yaml_errors_name_the_key(tmp_path, name):
    text, expected = BAD_YAML[name]
    path = tmp_path / "fsdp2.yaml"
    path.write_text(text)
    with pytest.raises(Fsdp2ConfigError) as caught:
        load_config(str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"--fsdp2-config-path {path}: "), message
    assert expected in message, message


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(Fsdp2ConfigError, match="no such file"):
        load_config(str(tmp_path / "absent.yaml"))
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(str(tmp_path / "empty.yaml")).sub_modules_to_wrap is None


def megatron_args(**values) -> argparse.Namespace:
    defaults = dict(use_torch_fsdp2=True, fsdp2_config_path=None, pipeline_model_parallel_size=1,
                    expert_model_parallel_size=1, use_distributed_optimizer=False, use_megatron_fsdp=False,
                    gradient_accumulation_fusion=False, fp16=False, bf16=False, init_model_with_meta_device=False,
                    save=None, load=None, ckpt_format="torch_dist", torch_fsdp2_reshard_after_forward=True,
                    recompute_granularity=None)
    defaults.update(values)
    return argparse.Namespace(**defaults)


CPU = FeatureContext(backend=Backend("cpu", "gloo", "test"), flags=argparse.Namespace())


@pytest.mark.parametrize("values, expected", [
    (dict(pipeline_model_parallel_size=2), "pipeline parallelism (--pipeline-model-parallel-size 2)"),
    (dict(expert_model_parallel_size=2), "expert parallelism"),
    (dict(use_distributed_optimizer=True), "--use-distributed-optimizer (FSDP2 already shards"),
    (dict(init_model_with_meta_device=True), "--init-model-with-meta-device"),
    (dict(fp16=True), "--fp16"),
    (dict(gradient_accumulation_fusion=True), "gradient-accumulation fusion"),
    (dict(use_megatron_fsdp=True), "--use-megatron-fsdp"),
    (dict(save="ckpt", ckpt_format="torch"), "--ckpt-format torch_dist or safetensors, not torch"),
    (dict(use_torch_fsdp2=False, fsdp2_config_path="x.yaml"), "--fsdp2-config-path needs --use-torch-fsdp2"),
])
def test_unsupported_combinations_are_one_line(values, expected):
    with pytest.raises(ArgumentError) as caught:
        TorchFsdp2().validate(megatron_args(**values), CPU)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_what_megatron_refused_and_is_lifted():
    """Tied embeddings, TP, and any --ckpt-format when nothing is saved or loaded pass validation."""
    for values in (dict(ckpt_format="torch"), dict(save="ckpt", ckpt_format="safetensors"), dict(load="ckpt")):
        TorchFsdp2().validate(megatron_args(**values), CPU)


@pytest.mark.parametrize("text, values, expected", [
    ("param_dtype: bf16\n", {}, "param_dtype must be fp32 when --bf16 is not given"),
    ("param_dtype: fp32\n", dict(bf16=True), "param_dtype must be bf16 when --bf16 is given"),
    ("reshard_after_forward: true\n", dict(torch_fsdp2_reshard_after_forward=False),
     "contradicts --torch-fsdp2-no-reshard-after-forward"),
    ('recompute_modules: ["decoder.layers.{*}"]\n', dict(recompute_granularity="full"),
     "recompute_modules and --recompute-granularity"),
])
def test_yaml_must_agree_with_the_command_line(tmp_path, text, values, expected):
    path = tmp_path / "fsdp2.yaml"
    path.write_text(text)
    with pytest.raises(Fsdp2ConfigError, match=re.escape(expected)):
        resolve_config(load_config(str(path)), megatron_args(**values))


def test_defaults_follow_the_command_line():
    config = resolve_config(load_config(None), megatron_args(bf16=True, torch_fsdp2_reshard_after_forward=False))
    assert (str(config.param_dtype), str(config.reduce_dtype)) == ("torch.bfloat16", "torch.float32")
    assert config.reshard_after_forward is False and config.offload_to_cpu is False
    tied = config.wrap_patterns(tied_embeddings=True)[0]
    assert [p.text for p in tied] == ["*decoder.layers.{*}", "*mtp.layers.{*}"]
    untied = [p.text for p in config.wrap_patterns(tied_embeddings=False)[0]]
    assert untied == ["*decoder.layers.{*}", "*mtp.layers.{*}", "*embedding", "*output_layer"]
    # Every transformer layer wherever the model keeps it, none of their children.
    names = ["decoder.layers.3", "language_model.decoder.layers.0", "vision_model.decoder.layers.1",
             "decoder.layers.3.mlp", "decoder.final_layernorm"]
    assert [n for n in names if any(p.matches(n) for p in tied)] == names[:3]


@pytest.mark.parametrize("pattern, matches, misses", [
    ("decoder.layers.{*}", ["decoder.layers.0", "decoder.layers.27"], ["decoder.layers.0.mlp", "decoder.layers.x"]),
    ("decoder.layers.*", ["decoder.layers.0", "decoder.layers.0.mlp.linear_fc1"], ["decoder.final_layernorm"]),
    ("decoder.layers.{0-2,5}.mlp", ["decoder.layers.1.mlp", "decoder.layers.5.mlp"], ["decoder.layers.3.mlp"]),
    ("*.linear_qkv", ["decoder.layers.3.self_attention.linear_qkv"], ["decoder.layers.3.self_attention"]),
    ("output_layer", ["output_layer"], ["output_layers", "module.output_layer"]),
    ("decoder.layers.?", ["decoder.layers.7"], ["decoder.layers.12"]),
])
def test_module_name_patterns(pattern, matches, misses):
    compiled = compile_pattern(pattern)
    assert all(compiled.matches(name) for name in matches)
    assert not any(compiled.matches(name) for name in misses)


def test_readme_lists_every_yaml_key():
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{key}`" in readme for key in KEYS)
