"""Llama 3.x (llama2) and Qwen2.5 (qwen2) in the converter, in this process: their Megatron flags, the q/k/v
bias split, the config.json settings refused in one line, MindSpeed-LLM's Qwen2.5 conversion scripts, and
the model its Llama 3.1 and Qwen2.5 pretrain scripts build.

The tiny random checkpoints (tests/helpers/hf_fixtures.py make_tiny_llama: GQA 8 heads / 2 groups, head_dim
14, Llama with rope_type llama3) are transformers' own. Round trips: tests/unit/test_convert_ckpt.py; logits
against transformers, LoRA and the TP2 loss curve: tests/e2e/test_hf_parity.py.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from adaptor.convert import HfCheckpoint, Layout, megatron_args_from_hf_config, megatron_rank_tensors
from adaptor.convert.config_check import config_mismatch, hf_model_type, megatron_namespace
from helpers.processes import import_tool

convert_ckpt = import_tool("convert_ckpt")


def config_of(path) -> dict:
    return json.loads((path / "config.json").read_text())


def pairs(flags):
    return dict(zip(flags, flags[1:]))


def test_megatron_flags(hf_dirs):
    llama = megatron_args_from_hf_config("llama2", config_of(hf_dirs["llama_untied"]))
    qwen2 = megatron_args_from_hf_config("qwen2", config_of(hf_dirs["qwen2_tied"]))
    for flags in (llama, qwen2):
        assert {k: pairs(flags)[k] for k in ("--num-query-groups", "--kv-channels", "--num-attention-heads",
                                             "--position-embedding-type")} == {
            "--num-query-groups": "2", "--kv-channels": "14", "--num-attention-heads": "8",
            "--position-embedding-type": "rope"}
        assert "--qk-layernorm" not in flags and "--disable-bias-linear" in flags
    assert "--use-rope-scaling" in llama and pairs(llama)["--rope-scaling-factor"] == "8"
    assert "--untie-embeddings-and-output-weights" in llama and "--add-qkv-bias" not in llama
    assert "--add-qkv-bias" in qwen2 and "--use-rope-scaling" not in qwen2
    assert "--untie-embeddings-and-output-weights" not in qwen2


# config.json as the Hub publishes Llama-3.1-8B and Qwen2.5-7B (older transformers: rope_scaling, no layer_types)
LLAMA31_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}
QWEN25_7B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 152064,
}


def test_published_configs():
    llama = pairs(megatron_args_from_hf_config("llama2", LLAMA31_8B_CONFIG))
    assert {k: llama[k] for k in ("--kv-channels", "--num-query-groups", "--rotary-base", "--rope-scaling-factor",
                                  "--norm-epsilon")} == {
        "--kv-channels": "128", "--num-query-groups": "8", "--rotary-base": "500000", "--rope-scaling-factor": "8",
        "--norm-epsilon": "1e-05"}
    qwen = megatron_args_from_hf_config("qwen2", QWEN25_7B_CONFIG)
    assert pairs(qwen)["--kv-channels"] == "128" and "--add-qkv-bias" in qwen
    assert "--untie-embeddings-and-output-weights" in qwen and "--use-rope-scaling" not in qwen


def test_model_type_from_config(hf_dirs):
    """config.json's model_type picks the family, for --hf-load-dir and tools/hf_model_flags.py alike."""
    assert hf_model_type(config_of(hf_dirs["llama_untied"]), None, "x") == "llama2"
    assert hf_model_type(config_of(hf_dirs["qwen2_tied"]), None, "x") == "qwen2"
    lines = import_tool("hf_model_flags").flag_lines(str(hf_dirs["qwen2_tied"]))
    assert lines[0] == "512" and "--add-qkv-bias" in lines and "--qk-layernorm" not in lines


def test_flags_without_llama3_scaling_do_not_match_the_config(hf_dirs):
    """RoPE scaling is in no tensor's shape: --hf-load-dir's check names the flag."""
    flags = megatron_args_from_hf_config("llama2", config_of(hf_dirs["llama_untied"]))
    args, _, _ = megatron_namespace([f for f in flags if f != "--use-rope-scaling"])
    assert config_mismatch(args, flags) == ("--use-rope-scaling is False on the command line but True in the "
                                            "Hugging Face config")
    args, _, _ = megatron_namespace(flags[:-2] + ["--kv-channels", "14", "--add-qkv-bias"])
    assert config_mismatch(args, flags) == ("--add-qkv-bias is True on the command line but False in the "
                                            "Hugging Face config")
    args, _, _ = megatron_namespace(flags)
    assert config_mismatch(args, flags) is None


@pytest.mark.parametrize("key", ["llama_untied", "qwen2_tied"])
def test_config_written_from_the_flags_describes_the_same_model(hf_dirs, key):
    """--hf-save-dir without --hf-load-dir writes config.json from the flags: it gives back the same flags."""
    from adaptor.convert.online import hf_config_from_args

    kind = "llama2" if key.startswith("llama") else "qwen2"
    flags = megatron_args_from_hf_config(kind, config_of(hf_dirs[key]))
    args, _, _ = megatron_namespace(flags)
    args.model_type_hf, args.padded_vocab_size = kind, 512
    written = hf_config_from_args(args)
    assert written["model_type"] == config_of(hf_dirs[key])["model_type"]
    assert megatron_args_from_hf_config(kind, written) == flags


def test_qkv_bias_follows_the_query_groups(hf_dirs):
    """Rank r's linear_qkv.bias is, per query group of r, [q bias of the group's heads; k_g; v_g]."""
    hf = HfCheckpoint(hf_dirs["qwen2_untied"])
    heads, groups, head_dim, tp = 8, 2, 14, 2
    q = hf.get("model.layers.2.self_attn.q_proj.bias").view(groups, heads // groups * head_dim)
    k = hf.get("model.layers.2.self_attn.k_proj.bias").view(groups, head_dim)
    v = hf.get("model.layers.2.self_attn.v_proj.bias").view(groups, head_dim)
    for rank in range(tp):
        tensors = dict(megatron_rank_tensors(hf, "qwen2", Layout(tp=tp), tp_rank=rank))
        assert torch.equal(tensors["decoder.layers.2.self_attention.linear_qkv.bias"],
                           torch.cat([q[rank], k[rank], v[rank]]))
        assert "decoder.layers.2.self_attention.linear_proj.bias" not in tensors


# -- what the families' config.json can say that we do not build: one line naming the key ------------------

REFUSED = [
    ("llama_untied", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     "rope_scaling type 'dynamic' has no Megatron equivalent"),
    ("llama_untied", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                                          "rope_theta": 1e4}},
     "rope_scaling low_freq_factor=2.0 is not supported for rope_type llama3 (Megatron's Llama 3 scaling fixes "
     "it at 1)"),
    ("llama_untied", {"rope_parameters": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 131072,
                                          "rope_theta": 1e4}},
     "rope_scaling original_max_position_embeddings=131072 is not supported"),
    ("llama_untied", {"attention_bias": True}, "attention_bias=True is not supported for llama2"),
    ("llama_untied", {"mlp_bias": True}, "mlp_bias=True is not supported for llama2"),
    ("llama_untied", {"hidden_act": "gelu"}, "hidden_act='gelu' is not supported for llama2"),
    ("llama_untied", {"model_type": "qwen2"}, "model_type 'qwen2' is not 'llama'"),
    ("qwen2_tied", {"use_sliding_window": True}, "use_sliding_window=true is not supported for qwen2"),
    ("qwen2_tied", {"layer_types": ["full_attention"] * 3 + ["sliding_attention"]},
     "layer_types names 'sliding_attention' for layer 3"),
]


@pytest.mark.parametrize("key,change,needle", REFUSED, ids=[
    "rope-dynamic", "llama3-low-freq", "llama3-original-context", "attention-bias", "mlp-bias", "act", "model-type",
    "sliding-window", "sliding-layer"])
def test_config_we_do_not_build_is_one_line(hf_dirs, tmp_path, capsys, key, change, needle):
    src = shutil.copytree(hf_dirs[key], tmp_path / "src")
    (src / "config.json").write_text(json.dumps({**config_of(src), **change}))
    (tmp_path / "out").mkdir()
    kind = "llama2" if key.startswith("llama") else "qwen2"
    code = convert_ckpt.main(["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", kind,
                              "--load-dir", str(src), "--save-dir", str(tmp_path / "out" / "mg")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("convert_ckpt.py: error: config.json: "), err
    assert needle in err[0], err
    assert list((tmp_path / "out").iterdir()) == []


def test_missing_shard_is_one_line(hf_dirs, tmp_path, capsys):
    src = shutil.copytree(hf_dirs["qwen2_untied"], tmp_path / "src")
    (src / "model-00001-of-00002.safetensors").unlink()
    code = convert_ckpt.main(["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen2",
                              "--load-dir", str(src), "--save-dir", str(tmp_path / "mg")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "model-00001-of-00002.safetensors: missing shard" in err[0], err
    assert not (tmp_path / "mg").exists()


# -- MindSpeed-LLM's Qwen2.5 conversion scripts (examples/mcore/qwen25/ckpt_convert_qwen25_*.sh) -------------

def test_mindspeed_llm_qwen25_conversion_scripts(hf_dirs, tmp_path, capsys):
    """MindSpeed-LLM converts Qwen2.5 as --model-type-hf llama2 --add-qkv-bias: that is our qwen2, and back
    bit-exact (their hf2mcore script's TP1 PP4)."""
    hf = hf_dirs["qwen2_untied"]
    common = ["--use-mcore-models", "--model-type", "GPT", "--add-qkv-bias", "--model-type-hf", "llama2"]
    to_mg = common + ["--load-model-type", "hf", "--save-model-type", "mg", "--target-tensor-parallel-size", "1",
                      "--target-pipeline-parallel-size", "4", "--load-dir", str(hf), "--save-dir", str(tmp_path / "mg"),
                      "--tokenizer-model", str(hf / "tokenizer.json"), "--params-dtype", "bf16"]
    assert convert_ckpt.main(to_mg) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "--model-type-hf llama2 --add-qkv-bias: --model-type-hf qwen2" in err, err
    assert json.loads((tmp_path / "mg" / "release" / "common.json").read_text())  # written as a release
    to_hf = common + ["--load-model-type", "mg", "--save-model-type", "hf", "--target-tensor-parallel-size", "1",
                      "--target-pipeline-parallel-size", "1", "--load-dir", str(tmp_path / "mg"),
                      "--save-dir", str(tmp_path / "back")]
    assert convert_ckpt.main(to_hf) == 0, capsys.readouterr().err
    before, after = HfCheckpoint(hf), HfCheckpoint(tmp_path / "back")
    assert sorted(after.names()) == sorted(before.names())
    assert all(torch.equal(before.get(n), after.get(n)) for n in before.names())
    assert config_of(tmp_path / "back")["model_type"] == "qwen2"


def test_mindspeed_llm_training_flags_name_qwen2():
    from adaptor.command_line.mindspeed_llm import _model_type_hf

    notes = []
    argv = _model_type_hf(["--add-qkv-bias", "--model-type-hf", "llama2"], notes)
    assert argv == ["--add-qkv-bias", "--model-type-hf", "qwen2"] and len(notes) == 1
    assert _model_type_hf(["--model-type-hf", "llama2"], []) == ["--model-type-hf", "llama2"]



# -- MindSpeed-LLM's pretrain scripts build what config.json describes ---------------------------------------
# examples/mcore/llama31/pretrain_llama31_8b_128k_ptd.sh and examples/mcore/qwen25/pretrain_qwen25_0point5_32k_ptd.sh
# as published, every flag kept, sizes scaled to the tiny models (layers, hidden, heads, groups, FFN, vocabulary,
# sequence, batch, parallel sizes); the head dim is set with --kv-channels where the tiny model's is not
# hidden / heads. Through our rewrite of MindSpeed-LLM's flags, Megatron's parser reads a model that
# --hf-load-dir's check finds equal to config.json's.

LLAMA31_8B = [
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1", "--use-mcore-models",
    "--context-parallel-size", "1", "--context-parallel-algo", "megatron_cp_algo",
    "--no-create-attention-mask-in-dataloader", "--no-shared-storage", "--sparse-mode", "4",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--sequence-parallel", "--use-flash-attn",
    "--use-rotary-position-embeddings", "--use-fused-rmsnorm", "--use-fused-swiglu", "--rope-scaling-type", "llama3",
    "--rope-scaling-factor", "8.0", "--low-freq-factor", "1.0", "--high-freq-factor", "4.0",
    "--original-max-position-embeddings", "8192", "--tokenizer-type", "PretrainedFromHF",
    "--tokenizer-name-or-path", "TOKENIZER", "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "160",
    "--num-attention-heads", "8", "--kv-channels", "14", "--group-query-attention", "--num-query-groups", "2",
    "--seq-length", "64", "--max-position-embeddings", "64", "--make-vocab-size-divisible-by", "1",
    "--padded-vocab-size", "512", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--attention-dropout", "0.0", "--init-method-std", "0.01", "--hidden-dropout", "0.0",
    "--position-embedding-type", "rope", "--rotary-base", "10000", "--normalization", "RMSNorm",
    "--norm-epsilon", "1e-5", "--swiglu", "--no-masked-softmax-fusion", "--attention-softmax-in-fp32",
    "--lr", "1.25e-6", "--train-iters", "4", "--lr-decay-style", "cosine", "--min-lr", "1.25e-7",
    "--weight-decay", "1e-1", "--lr-warmup-fraction", "0.01", "--clip-grad", "1.0", "--adam-beta1", "0.9",
    "--adam-beta2", "0.95", "--initial-loss-scale", "4096", "--no-gradient-accumulation-fusion", "--no-load-optim",
    "--no-load-rng", "--bf16", "--data-path", "DATA", "--split", "100,0,0", "--log-interval", "1",
    "--save-interval", "2000", "--eval-interval", "2000", "--eval-iters", "0", "--distributed-backend", "nccl",
]
QWEN25_0POINT5B = [
    "--use-mcore-models", "--use-cp-send-recv-overlap", "--use-fused-ring-attention-update",
    "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--context-parallel-size", "2",
    "--context-parallel-algo", "megatron_cp_algo", "--sequence-parallel", "--use-distributed-optimizer",
    "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", "TOKENIZER", "--seq-length", "64",
    "--max-position-embeddings", "64", "--micro-batch-size", "1", "--global-batch-size", "8",
    "--group-query-attention", "--num-query-groups", "2", "--num-layers", "4", "--hidden-size", "64",
    "--ffn-hidden-size", "160", "--num-attention-heads", "8", "--kv-channels", "14", "--rotary-base", "10000",
    "--normalization", "RMSNorm", "--norm-epsilon", "1e-05", "--swiglu", "--add-qkv-bias", "--disable-bias-linear",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--make-vocab-size-divisible-by", "1",
    "--padded-vocab-size", "512", "--lr", "1.25e-6", "--train-iters", "4", "--lr-decay-style", "cosine",
    "--lr-warmup-fraction", "0.01", "--init-method-std", "0.01", "--position-embedding-type", "rope",
    "--use-fused-rmsnorm", "--use-fused-rotary-pos-emb", "--use-rotary-position-embeddings", "--use-fused-swiglu",
    "--overlap-grad-reduce", "--use-flash-attn", "--no-masked-softmax-fusion", "--attention-softmax-in-fp32",
    "--min-lr", "1.25e-7", "--weight-decay", "1e-1", "--clip-grad", "1.0", "--adam-beta1", "0.9",
    "--adam-beta2", "0.95", "--initial-loss-scale", "4096", "--no-gradient-accumulation-fusion", "--no-load-optim",
    "--no-load-rng", "--seed", "42", "--bf16", "--data-path", "DATA", "--split", "100,0,0", "--log-interval", "1",
    "--save-interval", "1000", "--eval-interval", "1000", "--eval-iters", "0", "--distributed-backend", "nccl",
    "--log-throughput", "--transformer-impl", "local",
]


@pytest.mark.parametrize("key,script", [("llama_untied", LLAMA31_8B), ("qwen2_tied", QWEN25_0POINT5B)],
                         ids=["llama31_8b", "qwen25_0point5b"])
def test_mindspeed_llm_pretrain_script_builds_the_config_model(hf_dirs, key, script):
    from adaptor.command_line.mindspeed_llm import rewrite_pretrain_argv

    kind = "llama2" if key.startswith("llama") else "qwen2"
    config_flags = megatron_args_from_hf_config(kind, config_of(hf_dirs[key]))
    rewrite = rewrite_pretrain_argv(list(script))
    assert rewrite.refused == [], rewrite.refused
    args, _, _ = megatron_namespace(rewrite.argv)
    assert config_mismatch(args, config_flags) is None
    # and the check sees the family's own flag: without it, the script's model is another one
    own = ("--rope-scaling-type", "llama3") if kind == "llama2" else ("--add-qkv-bias",)
    start = script.index(own[0])
    args, _, _ = megatron_namespace(rewrite_pretrain_argv(script[:start] + script[start + len(own):]).argv)
    missing = "--use-rope-scaling" if kind == "llama2" else "--add-qkv-bias"
    assert config_mismatch(args, config_flags).startswith(f"{missing} is False on the command line")
