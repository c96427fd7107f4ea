"""Conversion at virtual pipeline stages (interleaved schedule), in this process.

Reference points that do not come from the converter itself: transformers' ``save_pretrained`` output
(tests/helpers/hf_fixtures.py, 4 layers), megatron-core's own ``get_transformer_layer_offset`` (which layers
each model chunk builds) and the ``model0``, ``model1``, ... keys Megatron's checkpointing saves its chunks
under. The rank files against a checkpoint Megatron saves itself at PP2 x VPP2, and logits at that layout:
tests/e2e/test_convert_ckpt.py and tests/e2e/test_hf_parity.py.
"""
from __future__ import annotations

import json

import pytest
import torch

from adaptor.convert import HfCheckpoint, Layout, convert_hf_to_megatron, convert_megatron_to_hf
from helpers.processes import import_tool

convert_ckpt = import_tool("convert_ckpt")

FAMILY = {"qwen3_tied": "qwen3", "qwen3_untied": "qwen3", "qwen3_moe": "qwen3-moe", "mixtral": "mixtral",
          "deepseek_v3": "deepseek3", "llama_tied": "llama2"}


def load_rank(path):
    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)


@pytest.mark.parametrize("key,layout", [
    ("qwen3_tied", Layout(1, 2, vpp=2)), ("qwen3_untied", Layout(2, 2, vpp=2)), ("llama_tied", Layout(1, 2, vpp=2)),
    ("qwen3_moe", Layout(2, 2, 2, vpp=2)), ("mixtral", Layout(2, 2, 1, vpp=2)), ("deepseek_v3", Layout(1, 2, 2, vpp=2)),
], ids=lambda v: f"tp{v.tp}pp{v.pp}ep{v.ep}vpp{v.vpp}" if isinstance(v, Layout) else v)
def test_round_trip_is_bit_exact(tiny_hf, tmp_path, key, layout):
    src = tiny_hf[key]
    convert_hf_to_megatron(src, tmp_path / "mg", FAMILY[key], layout, save_format="torch")
    convert_megatron_to_hf(tmp_path / "mg", tmp_path / "hf")
    before, after = HfCheckpoint(src), HfCheckpoint(tmp_path / "hf")
    assert sorted(after.names()) == sorted(before.names())
    for name in before.names():
        a, b = before.get(name), after.get(name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    meta = json.loads((tmp_path / "mg" / "hf" / "conversion.json").read_text())
    assert (meta["pp"], meta["vpp"]) == (layout.pp, layout.vpp)


def test_each_chunk_holds_the_layers_megatron_builds_there(tiny_hf, tmp_path):
    """PP2 x VPP2, 4 layers, tied: the file of pipeline rank p holds "model0" and "model1" (Megatron's keys for
    its chunks, no "model"); chunk v holds as its local layer 0 the HF layer that megatron-core's
    get_transformer_layer_offset gives (v, p); embedding in chunk 0 of rank 0, final norm and the tied
    output layer's copy in chunk 1 of rank 1."""
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    src = tiny_hf["qwen3_tied"]
    mg = convert_hf_to_megatron(src, tmp_path / "mg", "qwen3", Layout(1, 2, vpp=2), save_format="torch")
    config = TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=2,
                               virtual_pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
    hf = HfCheckpoint(src)
    for pp_rank in range(2):
        state = load_rank(mg / "release" / f"mp_rank_00_{pp_rank:03d}" / "model_optim_rng.pt")
        assert sorted(k for k in state if k.startswith("model")) == ["model0", "model1"]
        for vp_stage in range(2):
            chunk = state[f"model{vp_stage}"]
            offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank)
            layers = {name.split(".")[2] for name in chunk if name.startswith("decoder.layers.")}
            assert layers == {"0"}
            assert torch.equal(chunk["decoder.layers.0.mlp.linear_fc2.weight"],
                               hf.get(f"model.layers.{offset}.mlp.down_proj.weight"))
            first, last = (pp_rank, vp_stage) == (0, 0), (pp_rank, vp_stage) == (1, 1)
            assert ("embedding.word_embeddings.weight" in chunk) == first
            assert ("decoder.final_layernorm.weight" in chunk) == last
            assert ("output_layer.weight" in chunk) == last and ("output_layer._extra_state" in chunk) == last


def test_command_line_takes_mindspeed_llms_virtual_stage_flag(tiny_hf, tmp_path, capsys):
    """--num-layers-per-virtual-pipeline-stage (MindSpeed-LLM's convert_ckpt.py flag) at PP2: 4 layers, 1 per chunk
    -> 2 chunks per rank in torch rank files; the safetensors release has no layout and is written as ever
    (it loads at PP2 x VPP2: tests/e2e/test_convert_ckpt.py); a split that does not divide is one line."""
    args = ["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
            "--load-dir", str(tiny_hf["qwen3_tied"]), "--target-pipeline-parallel-size", "2",
            "--num-layers-per-virtual-pipeline-stage", "1"]
    assert convert_ckpt.main(args + ["--save-dir", str(tmp_path / "st")]) == 0
    assert sorted(p.name for p in (tmp_path / "st" / "release").iterdir()) == [
        "common.json", "metadata.json", "rank_00000.safetensors"]
    assert convert_ckpt.main(args + ["--save-dir", str(tmp_path / "pt"), "--save-format", "torch"]) == 0
    for pp_rank in range(2):
        state = load_rank(tmp_path / "pt" / "release" / f"mp_rank_00_{pp_rank:03d}" / "model_optim_rng.pt")
        assert sorted(k for k in state if k.startswith("model")) == ["model0", "model1"]
    capsys.readouterr()
    assert convert_ckpt.main(args + ["--save-dir", str(tmp_path / "odd"), "--save-format", "torch",
                                     "--num-layers-per-virtual-pipeline-stage", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x 3 layers per virtual" in err[0], err
    assert not (tmp_path / "odd").exists()


@pytest.mark.parametrize("flags,needle", [
    (["--vpp", "2"], "--vpp 2 needs --pp 2 or more"),
    (["--pp", "2", "--vpp", "4"], "num_hidden_layers=4 is not divisible by --pp 2 x 4 (--vpp)"),
])
def test_parity_tool_virtual_stages_that_cannot_split(tiny_hf, capsys, monkeypatch, flags, needle):
    monkeypatch.setenv("ADAPTOR_QUIET", "1")  # as the tool sets it; restored afterwards
    check_hf_parity = import_tool("check_hf_parity")
    src = tiny_hf["qwen3_tied"]
    capsys.readouterr()  # transformers' progress lines, if the directory was written just now
    with pytest.raises(SystemExit) as exit_:
        check_hf_parity.main(["--hf-dir", str(src), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and needle in err[0], err
