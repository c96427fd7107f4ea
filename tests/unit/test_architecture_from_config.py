"""The architecture taken from config.json where the command line is silent (patches/hf/architecture_from_config.py).

In-process, through Megatron's own parser: the flags config.json describes are appended where the command
line gives none, a given flag is kept (the --hf-load-dir check then compares it), --max-position-embeddings
covers a longer --seq-length, a converted checkpoint's hf/config.json serves --load the same way, and an
unsupported config.json is one line. Whole runs without model flags: tests/e2e/test_hf_parity.py.
"""
from __future__ import annotations

import json

import pytest

from helpers.hf_fixtures import make_tiny_qwen3

import adaptor  # noqa: F401  (before patches: it registers them)
from adaptor.convert.config_check import megatron_namespace, model_flags
from patches.hf.architecture_from_config import ArchitectureFromConfig


def test_silent_flags_come_from_config_and_given_ones_stay(tmp_path):
    hf_dir = make_tiny_qwen3(tmp_path / "qwen3", seed=1)
    expected, _, _ = megatron_namespace(model_flags("qwen3", json.loads((hf_dir / "config.json").read_text())))
    feature = ArchitectureFromConfig()
    argv = feature.rewrite_argv(["--seq-length", "32", "--num-layers", "3", "--hf-load-dir", str(hf_dir)])
    args, _, _ = megatron_namespace(argv)
    assert args.num_layers == 3 and argv.count("--num-layers") == 1
    for dest in ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                 "group_query_attention", "qk_layernorm", "swiglu", "add_bias_linear", "normalization",
                 "position_embedding_type", "rotary_base", "layernorm_epsilon", "vocab_size", "max_position_embeddings"):
        assert getattr(args, dest) == getattr(expected, dest), dest
    assert feature.note.startswith(f"--hf-load-dir {hf_dir}: architecture from its config.json: --hidden-size 64 ")
    assert "--num-layers" not in feature.note and args.seq_length == 32


def test_values_are_left_to_the_parser_that_owns_them(tmp_path):
    """Only which flags are given is read: --ckpt-format safetensors (a choice a feature adds to Megatron's
    parser later) and a flag Megatron does not know pass through untouched."""
    hf_dir = make_tiny_qwen3(tmp_path / "qwen3", seed=1)
    given = ["--hf-load-dir", str(hf_dir), "--ckpt-format", "safetensors", "--not-a-megatron-flag", "x"]
    argv = ArchitectureFromConfig().rewrite_argv(given)
    assert argv[:len(given)] == given and "--num-layers" in argv[len(given):]


def test_a_longer_sequence_sets_the_position_table(tmp_path):
    hf_dir = make_tiny_qwen3(tmp_path / "qwen3", seed=1)  # max_position_embeddings 64
    feature = ArchitectureFromConfig()
    args, _, _ = megatron_namespace(feature.rewrite_argv(["--seq-length=256", f"--hf-load-dir={hf_dir}"]))
    assert args.max_position_embeddings == 256
    assert "--max-position-embeddings 256 (--seq-length; config.json has 64)" in feature.note


def test_a_converted_checkpoint_describes_itself(tmp_path):
    from adaptor.convert import Layout, convert_hf_to_megatron

    hf_dir = make_tiny_qwen3(tmp_path / "qwen3", tied=False, seed=1)
    converted = convert_hf_to_megatron(hf_dir, tmp_path / "mg", "qwen3", Layout(), save_format="torch")
    feature = ArchitectureFromConfig()
    args, _, _ = megatron_namespace(feature.rewrite_argv(["--load", str(converted)]))
    assert args.untie_embeddings_and_output_weights and args.num_layers == 4
    assert feature.note.startswith(f"--load {converted}: architecture from its config.json:")
    plain = ["--load", str(tmp_path)]  # not a converted checkpoint: nothing to take
    assert feature.rewrite_argv(plain) == plain and feature.note is None


def test_a_config_no_family_expresses_is_one_line(tmp_path, capsys):
    hf_dir = make_tiny_qwen3(tmp_path / "qwen3", seed=1)
    capsys.readouterr()  # transformers' progress bar
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                                                                  "rope_theta": 1e6}}))
    with pytest.raises(SystemExit) as exited:
        ArchitectureFromConfig().rewrite_argv(["--hf-load-dir", str(hf_dir)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == (f"megatron-adaptor: error: --hf-load-dir {hf_dir}: config.json: "
                                               f"rope_scaling type 'dynamic' has no Megatron equivalent here "
                                               f"(supported: default, linear, yarn, llama3)")
