"""tools/convert_ckpt.py and adaptor.convert in this process: HF <-> Megatron checkpoints, and bad input.

Reference points that do not come from the converter itself: transformers' save_pretrained
output (tests/helpers/hf_fixtures.py) and megatron-core's own tensor splits. Megatron's own
checkpoints at the same layout, pretrain_gpt.py --load runs and the converter's command line:
tests/e2e/test_convert_ckpt.py.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from adaptor.convert import (
    HfCheckpoint, Layout, convert_hf_to_megatron, convert_megatron_to_hf, megatron_args_from_hf_config,
    megatron_rank_tensors,
)
from helpers.megatron_runs import TINY_DEEPSEEK_V3, TINY_QWEN3
from helpers.processes import import_tool

convert_ckpt = import_tool("convert_ckpt")


def model_type(key: str) -> str:
    """The family (--model-type-hf) of an hf_models key."""
    return next((kind for prefix, kind in (("deepseek", "deepseek3"), ("llama", "llama2"), ("qwen2", "qwen2"))
                 if key.startswith(prefix)), "qwen3")


@pytest.mark.parametrize("key,layout", [
    ("qwen3_tied", Layout()), ("qwen3_tied", Layout(2, 2)), ("qwen3_untied", Layout()),
    ("qwen3_untied", Layout(2, 2)), ("deepseek3", Layout()), ("deepseek3", Layout(2, 2, 2)),
    ("deepseek3", Layout(2, 1, 2, etp=1)), ("llama_untied", Layout()), ("llama_untied", Layout(2, 2)),
    ("llama_tied", Layout(2, 2)), ("qwen2_tied", Layout(2, 2)), ("qwen2_untied", Layout(2, 1)),
])
@pytest.mark.parametrize("save_format", ["safetensors", "torch"])
def test_round_trip_is_bit_exact(hf_models, tmp_path, key, layout, save_format):
    src = hf_models[key]
    convert_hf_to_megatron(src, tmp_path / "mg", model_type(key), layout, save_format=save_format)
    convert_megatron_to_hf(tmp_path / "mg", tmp_path / "hf", max_shard_bytes=100_000)  # forces several shards
    before, after = HfCheckpoint(src), HfCheckpoint(tmp_path / "hf")
    assert sorted(after.names()) == sorted(before.names())
    for name in before.names():
        a, b = before.get(name), after.get(name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[-1] == f"model-{len(files):05d}-of-{len(files):05d}.safetensors"
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_qkv_interleave_matches_attention_heads(hf_models):
    """Rank r's linear_qkv output, split as Megatron's SelfAttention splits it, is HF's q/k/v of r's groups."""
    hf = HfCheckpoint(hf_models["qwen3_tied"])
    heads, groups, head_dim, tp = 4, 2, 32, 2
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    q = (x @ hf.get("model.layers.1.self_attn.q_proj.weight").T).view(3, heads, head_dim)
    k = (x @ hf.get("model.layers.1.self_attn.k_proj.weight").T).view(3, groups, head_dim)
    v = (x @ hf.get("model.layers.1.self_attn.v_proj.weight").T).view(3, groups, head_dim)
    for rank in range(tp):
        tensors = dict(megatron_rank_tensors(hf, "qwen3", Layout(tp=tp), tp_rank=rank))
        mixed = (x @ tensors["decoder.layers.1.self_attention.linear_qkv.weight"].T)
        mixed = mixed.view(3, groups // tp, (heads // groups + 2) * head_dim)
        mq, mk, mv = mixed.split([heads // groups * head_dim, head_dim, head_dim], dim=-1)
        local = slice(rank * groups // tp, (rank + 1) * groups // tp)
        heads_here = slice(rank * heads // tp, (rank + 1) * heads // tp)
        torch.testing.assert_close(mq.reshape(3, heads // tp, head_dim), q[:, heads_here], rtol=0, atol=1e-6)
        torch.testing.assert_close(mk, k[:, local], rtol=0, atol=1e-6)
        torch.testing.assert_close(mv, v[:, local], rtol=0, atol=1e-6)


def test_vocab_padding_and_gate_up_split(hf_models):
    hf = HfCheckpoint(hf_models["qwen3_untied"])
    tensors = [dict(megatron_rank_tensors(hf, "qwen3", Layout(tp=2), tp_rank=r, padded_vocab_size=640))
               for r in range(2)]
    embed = hf.get("model.embed_tokens.weight")
    assert torch.equal(tensors[0]["embedding.word_embeddings.weight"], embed[:320])
    assert torch.equal(tensors[1]["embedding.word_embeddings.weight"][:192], embed[320:])
    assert not tensors[1]["output_layer.weight"][192:].any()  # padded rows are zero
    gate, up = hf.get("model.layers.0.mlp.gate_proj.weight"), hf.get("model.layers.0.mlp.up_proj.weight")
    fc1 = tensors[1]["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([gate[96:], up[96:]]))


def test_megatron_args_build_the_converted_architecture(hf_models):
    qwen = megatron_args_from_hf_config("qwen3", json.loads((hf_models["qwen3_tied"] / "config.json").read_text()))
    ds = megatron_args_from_hf_config("deepseek3", json.loads((hf_models["deepseek3"] / "config.json").read_text()))
    # The hand-written tiny flag sets of tests/helpers/megatron_runs.py describe the same models.
    for flags, reference in ((qwen, TINY_QWEN3), (ds, TINY_DEEPSEEK_V3)):
        pairs = dict(zip(flags, flags[1:]))
        ref_pairs = dict(zip(reference, reference[1:]))
        for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
                     "--num-query-groups", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--v-head-dim",
                     "--qk-pos-emb-head-dim", "--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk",
                     "--moe-router-num-groups", "--moe-router-group-topk", "--mtp-num-layers", "--rotary-base",
                     "--moe-shared-expert-intermediate-size", "--rotary-scaling-factor"):
            if flag in ref_pairs:
                assert float(pairs[flag]) == float(ref_pairs[flag]), flag
        assert eval(pairs.get("--moe-layer-freq", "0")) == eval(ref_pairs.get("--moe-layer-freq", "0"))
    assert "--untie-embeddings-and-output-weights" not in qwen and "--untie-embeddings-and-output-weights" in ds


# -- bad input ---------------------------------------------------------------------------------

def cli(args, capsys):
    code = convert_ckpt.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def hf_to_mg(src, dst, kind, *extra):
    return ["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", kind,
            "--load-dir", str(src), "--save-dir", str(dst), *extra]


def assert_failed_cleanly(code, err, parent, needle, before=()):
    assert code != 0
    assert len(err) == 1 and err[0].startswith("convert_ckpt.py: error: ") and needle in err[0], err
    assert sorted(p.name for p in parent.iterdir()) == sorted(before)


def copy_model(hf_models, key, tmp_path):
    return shutil.copytree(hf_models[key], tmp_path / "src")


def test_missing_shard(hf_models, tmp_path, capsys):
    src = copy_model(hf_models, "deepseek3", tmp_path)
    (src / "model-00002-of-00002.safetensors").unlink()
    out = tmp_path / "out"
    code, err = cli(hf_to_mg(src, out / "mg", "deepseek3"), capsys)
    assert code != 0 and "model-00002-of-00002.safetensors: missing shard" in err[0] and len(err) == 1
    assert not out.exists() or not any(out.iterdir())


def test_truncated_shard(hf_models, tmp_path, capsys):
    src = copy_model(hf_models, "deepseek3", tmp_path)
    shard = src / "model-00001-of-00002.safetensors"
    os.truncate(shard, shard.stat().st_size - 100)
    (tmp_path / "out").mkdir()
    code, err = cli(hf_to_mg(src, tmp_path / "out" / "mg", "deepseek3"), capsys)
    assert_failed_cleanly(code, err, tmp_path / "out", "truncated: tensor")


@pytest.mark.parametrize("field,value,needle", [
    ("num_attention_heads", 8, "model.layers.0.self_attn.q_proj.weight [128, 64]"),
    ("num_hidden_layers", 2, "tensor model.layers.2."),
    ("vocab_size", 500, "config.json says vocab_size=500"),
])
def test_config_that_does_not_match_the_tensors(hf_models, tmp_path, capsys, field, value, needle):
    src = copy_model(hf_models, "qwen3_untied", tmp_path)
    config = json.loads((src / "config.json").read_text())
    config[field] = value
    (src / "config.json").write_text(json.dumps(config))
    (tmp_path / "out").mkdir()
    code, err = cli(hf_to_mg(src, tmp_path / "out" / "mg", "qwen3", "--target-tensor-parallel-size", "2"), capsys)
    assert_failed_cleanly(code, err, tmp_path / "out", needle)


@pytest.mark.parametrize("field,value", [
    ("norm_topk_prob", False), ("scoring_func", "softmax"), ("topk_group", 2), ("rms_norm_eps", 1e-5),
])
def test_deepseek_config_megatron_would_compute_differently(hf_models, tmp_path, capsys, field, value):
    # Each of these makes transformers' DeepseekV3 compute something Megatron's MoE/MLA does not.
    src = copy_model(hf_models, "deepseek3", tmp_path)
    config = json.loads((src / "config.json").read_text())
    config[field] = value
    (src / "config.json").write_text(json.dumps(config))
    (tmp_path / "out").mkdir()
    code, err = cli(hf_to_mg(src, tmp_path / "out" / "mg", "deepseek3"), capsys)
    needle = "num_experts_per_tok/topk_group" if field == "topk_group" else field
    assert_failed_cleanly(code, err, tmp_path / "out", f"this {needle} is not supported")


@pytest.mark.parametrize("key,flags,needle", [
    ("qwen3_tied", ["--target-tensor-parallel-size", "4"], "num_key_value_heads (query groups)=2"),
    ("qwen3_tied", ["--target-pipeline-parallel-size", "3"], "num_hidden_layers=4"),
    ("deepseek3", ["--target-expert-parallel-size", "3"], "4 routed experts"),
    ("deepseek3", ["--target-tensor-parallel-size", "8"], "num_attention_heads=4"),
    ("qwen2_tied", ["--target-tensor-parallel-size", "4"], "num_key_value_heads (query groups)=2"),
    ("llama_untied", ["--target-expert-parallel-size", "2"], "--target-expert-parallel-size 2"),
])
def test_layout_that_cannot_split(hf_models, tmp_path, capsys, key, flags, needle):
    (tmp_path / "out").mkdir()
    code, err = cli(hf_to_mg(hf_models[key], tmp_path / "out" / "mg", model_type(key), *flags), capsys)
    assert_failed_cleanly(code, err, tmp_path / "out", needle)


def test_existing_save_dir_is_not_clobbered(hf_models, tmp_path, capsys):
    save = tmp_path / "mg"
    save.mkdir()
    (save / "keep.txt").write_text("mine")
    code, err = cli(hf_to_mg(hf_models["qwen3_tied"], save, "qwen3"), capsys)
    assert_failed_cleanly(code, err, tmp_path, "exists and is not empty", before=["mg"])
    assert (save / "keep.txt").read_text() == "mine"


# -- the default format, and pickles that would run code ------------------------------------------

def mg_to_hf(src, dst):
    return ["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(src), "--save-dir", str(dst)]


def test_hf_to_mg_writes_safetensors_by_default_and_torch_on_request(hf_models, tmp_path, capsys):
    """The default output holds no pickle: one safetensors release file; --save-format torch writes
    Megatron's legacy rank files at the target layout. mg -> hf reads both."""
    src = hf_models["qwen3_tied"]
    code, err = cli(hf_to_mg(src, tmp_path / "st", "qwen3", "--target-tensor-parallel-size", "2"), capsys)
    assert code == 0, err
    written = sorted(str(p.relative_to(tmp_path / "st")) for p in (tmp_path / "st").rglob("*") if p.is_file())
    assert [p for p in written if not p.startswith("hf/")] == [
        "latest_checkpointed_iteration.txt", "release/common.json", "release/metadata.json",
        "release/rank_00000.safetensors"]
    code, err = cli(hf_to_mg(src, tmp_path / "pt", "qwen3", "--target-tensor-parallel-size", "2",
                             "--save-format", "torch"), capsys)
    assert code == 0, err
    assert sorted(p.parent.name for p in (tmp_path / "pt" / "release").glob("*/model_optim_rng.pt")) == [
        "mp_rank_00", "mp_rank_01"]
    for name in ("st", "pt"):
        code, err = cli(mg_to_hf(tmp_path / name, tmp_path / f"{name}_hf"), capsys)
        assert code == 0, err
        before, after = HfCheckpoint(src), HfCheckpoint(tmp_path / f"{name}_hf")
        assert all(torch.equal(before.get(n), after.get(n)) for n in before.names())


class _RunsShell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_mg_to_hf_refuses_a_torch_checkpoint_that_would_run_code(hf_models, tmp_path, capsys, monkeypatch):
    from adaptor.safe_load import torch_load

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    mg = convert_hf_to_megatron(hf_models["qwen3_tied"], tmp_path / "mg", "qwen3", Layout(), save_format="torch")
    rank_file = mg / "release" / "mp_rank_00" / "model_optim_rng.pt"
    marker = tmp_path / "code_ran"
    state = torch_load(rank_file)
    state["args"] = _RunsShell(marker)
    torch.save(state, rank_file)
    before = rank_file.read_bytes()
    (tmp_path / "out").mkdir()
    code, err = cli(mg_to_hf(mg, tmp_path / "out" / "hf"), capsys)
    assert_failed_cleanly(code, err, tmp_path / "out", f"{rank_file}: refused to unpickle posix.system")
    assert not marker.exists() and rank_file.read_bytes() == before
