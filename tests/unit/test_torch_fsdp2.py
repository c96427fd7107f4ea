"""FSDP2 (``--use-torch-fsdp2``) in this process: its YAML configuration, argument checks and module patterns.

The same code the training runs of tests/e2e/test_torch_fsdp2.py go through: the YAML reader and
the feature's argument validation (each error is one line naming the key or flag), the defaults the
command line gives the configuration, and the module-name patterns of ``sub_modules_to_wrap``,
``ignored_modules`` and ``recompute_modules``.
"""
from __future__ import annotations

import argparse
import re

import pytest
import torch

from adaptor.backend import Backend
from adaptor.features import ArgumentError, FeatureContext
from adaptor.fsdp2.config import KEYS, Fsdp2ConfigError, load_config, resolve_config
from adaptor.fsdp2.patterns import compile_pattern
from helpers.paths import ROOT
from patches.fsdp2.torch_fsdp2 import TorchFsdp2


# In-process checks of the same code the runs of tests/e2e/test_torch_fsdp2.py go through: the YAML
# reader and the feature's argument validation (each is one line naming the key or flag).
BAD_YAML = {
    "not_a_list": ("sub_modules_to_wrap: decoder.layers.{*}\n", "sub_modules_to_wrap must be a list"),
    "not_strings": ("ignored_modules: [1, 2]\n", "ignored_modules must be a list"),
    "bad_brace": ('recompute_modules: ["decoder.layers.{1-x}"]\n', "recompute_modules: 'decoder.layers.{1-x}'"),
    "backwards_range": ('recompute_modules: ["decoder.layers.{3-1}"]\n', "range 3-1 runs backwards"),
    "unbalanced": ('ignored_modules: ["decoder.layers.{0"]\n', "unbalanced brace"),
    "reshard_int": ("reshard_after_forward: 2\n", "reshard_after_forward must be true or false"),
    "param_dtype": ("param_dtype: int8\n", "param_dtype must be one of bf16, fp16, fp32"),
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
    (dict(gradient_accumulation_fusion=True), "gradient-accumulation fusion"),
    (dict(use_megatron_fsdp=True), "--use-megatron-fsdp"),
    (dict(save="ckpt", ckpt_format="torch"), "--ckpt-format torch_dist, safetensors or torch_dcp, not torch"),
    (dict(use_torch_fsdp2=False, fsdp2_config_path="x.yaml"), "--fsdp2-config-path needs --use-torch-fsdp2"),
])
def test_unsupported_combinations_are_one_line(values, expected):
    with pytest.raises(ArgumentError) as caught:
        TorchFsdp2().validate(megatron_args(**values), CPU)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_what_megatron_refused_and_is_lifted():
    """Tied embeddings, TP, --fp16, and any --ckpt-format when nothing is saved or loaded pass validation."""
    for values in (dict(ckpt_format="torch"), dict(save="ckpt", ckpt_format="safetensors"), dict(load="ckpt"),
                   dict(save="ckpt", ckpt_format="torch_dcp"), dict(fp16=True)):
        TorchFsdp2().validate(megatron_args(**values), CPU)


@pytest.mark.parametrize("text, values, expected", [
    ("param_dtype: bf16\n", {}, "param_dtype must be fp32 when neither --bf16 nor --fp16 is given"),
    ("param_dtype: fp32\n", dict(bf16=True), "param_dtype must be bf16 when --bf16 is given"),
    ("param_dtype: bf16\n", dict(fp16=True), "param_dtype must be fp16 when --fp16 is given"),
    ("param_dtype: fp16\n", {}, "param_dtype must be fp32 when neither --bf16 nor --fp16 is given"),
    ("reduce_dtype: fp16\n", dict(bf16=True), "reduce_dtype fp16 needs --fp16"),
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


def test_fp16_computes_in_fp16_and_reduces_in_fp32_unless_told(tmp_path):
    config = resolve_config(load_config(None), megatron_args(fp16=True))
    assert (config.param_dtype, config.reduce_dtype) == (torch.float16, torch.float32)
    path = tmp_path / "fsdp2.yaml"
    path.write_text("param_dtype: float16\nreduce_dtype: half\n")  # the YAML names fp16 three ways
    config = resolve_config(load_config(str(path)), megatron_args(fp16=True))
    assert (config.param_dtype, config.reduce_dtype) == (torch.float16, torch.float16)


def test_defaults_follow_the_command_line():
    config = resolve_config(load_config(None), megatron_args(bf16=True, torch_fsdp2_reshard_after_forward=False))
    assert (str(config.param_dtype), str(config.reduce_dtype)) == ("torch.bfloat16", "torch.float32")
    assert config.reshard_after_forward is False and config.offload_to_cpu is False
    tied = config.wrap_patterns(tied_embeddings=True)[0]
    assert [p.text for p in tied] == ["*decoder.layers.{*}", "*mtp.layers.{*}", "*vision_model.layers.{*}"]
    untied = [p.text for p in config.wrap_patterns(tied_embeddings=False)[0]]
    assert untied == ["*decoder.layers.{*}", "*mtp.layers.{*}", "*vision_model.layers.{*}", "*embedding",
                      "*output_layer"]
    # Every transformer layer wherever the model keeps it (a Qwen-VL tower's blocks too), none of their children.
    names = ["decoder.layers.3", "language_model.decoder.layers.0", "vision_model.decoder.layers.1",
             "vision_model.layers.0", "decoder.layers.3.mlp", "vision_model.layers.0.mlp", "vision_model.merger",
             "decoder.final_layernorm"]
    assert [n for n in names if any(p.matches(n) for p in tied)] == names[:4]


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
    readme = (ROOT / "docs" / "fsdp2.md").read_text()  # the FSDP2 page of the documentation
    assert all(f"`{key}`" in readme for key in KEYS)
