"""LoRA adapters between Megatron's fused tensor-parallel linears and PEFT's per-projection layout.

In-process checks of adaptor/convert/lora.py on a synthetic Qwen3-shaped adapter (GQA 4 heads / 2
groups, head_dim 32 != hidden/heads): what each Megatron rank computes with its part of the
adapter equals what PEFT's q/k/v/o/gate/up/down adapters compute; export after import gives back
the adapter bit for bit at TP2/PP2; merging on each rank equals merging whole; adapters Megatron's
fused linears cannot hold are refused in one line. With Megatron and peft themselves:
tests/e2e/test_lora_hf.py.
"""
from __future__ import annotations

import json

import pytest
import torch

from adaptor.convert import ConversionError, Layout
from adaptor.convert.layout import GroupedQKV
from adaptor.convert.lora import (
    CONFIG_FILE, LINEARS, WEIGHTS_FILE, LoraSettings, PeftAdapter, adapter_config, lora_mapping, merge_lora_state,
    peft_name, peft_rank_tensors, target_modules, write_peft_adapter,
)
from adaptor.convert.models import model_mapping
from adaptor.safetensors_file import write_file

HIDDEN, HEADS, GROUPS, HEAD_DIM, FFN, LAYERS, R = 64, 4, 2, 32, 192, 2, 4
CONFIG = {"model_type": "qwen3", "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": GROUPS,
          "head_dim": HEAD_DIM, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "vocab_size": 512,
          "tie_word_embeddings": True}
SETTINGS = LoraSettings(r=R, alpha=16.0, dropout=0.0, targets=LINEARS)
SHAPES = {"self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN), "self_attn.k_proj": (GROUPS * HEAD_DIM, HIDDEN),
          "self_attn.v_proj": (GROUPS * HEAD_DIM, HIDDEN), "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
          "mlp.gate_proj": (FFN, HIDDEN), "mlp.up_proj": (FFN, HIDDEN), "mlp.down_proj": (HIDDEN, FFN)}
SHARED_A = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))


def assert_close(got, expected):
    """fp32 sums of up to 192 products, in another order (rank partial sums, A before B): each rounding is
    6e-8 relative to the values summed, so differences stay below 1e-5 of the largest output (measured
    2e-7); a wrong row, group or scaling is off by the outputs' own size."""
    bound = 1e-5 * expected.abs().max().item()
    diff = (got - expected).abs().max().item()
    assert got.shape == expected.shape and diff <= bound, (tuple(got.shape), tuple(expected.shape), diff, bound)


def make_adapter(path, separate_a: bool = False, seed: int = 0, layers: int = LAYERS):
    """A PEFT adapter dir; q/k/v and gate/up share one lora_A (unless `separate_a`), B non-zero."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        shared = {}
        for module, (out, inp) in SHAPES.items():
            hf = f"model.layers.{layer}.{module}.weight"
            group = next((grp for grp in SHARED_A if module in grp), (module,))
            if separate_a or group[0] not in shared:
                shared[group[0]] = torch.randn(R, inp, generator=g)
            tensors[peft_name(hf, "lora_A")] = shared[group[0]].clone()
            tensors[peft_name(hf, "lora_B")] = torch.randn(out, R, generator=g)
    path.mkdir(parents=True, exist_ok=True)
    write_file(path / WEIGHTS_FILE, sorted(tensors.items()))
    config = adapter_config(SETTINGS, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                            None)
    (path / CONFIG_FILE).write_text(json.dumps(config))
    return path, tensors


def wanted(layout: Layout, pp_rank: int) -> set[str]:
    mapping = lora_mapping(model_mapping("qwen3", CONFIG), LINEARS)
    return {mapping.local_name(p, layout) for p in mapping.params(512) if mapping.stage_of(p, layout) == [pp_rank]}


def rank_states(adapter_dir, layout: Layout) -> dict:
    adapter = PeftAdapter(adapter_dir)
    return {(t, p, 0): dict(peft_rank_tensors(adapter, "qwen3", CONFIG, layout, t, p, 0, SETTINGS, wanted(layout, p)))
            for t in range(layout.tp) for p in range(layout.pp)}


@pytest.mark.parametrize("tp", [1, 2])
def test_rank_parts_compute_the_projection_adapters(tmp_path, tp):
    """Column-parallel ranks' outputs, merged like the base weight's rows, and row-parallel ranks' partial
    sums equal PEFT's per-projection scaling * B(A(x))."""
    _, peft = make_adapter(tmp_path / "a")
    states = rank_states(tmp_path / "a", Layout(tp=tp))
    s = SETTINGS.scaling
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, HIDDEN, generator=g)
    for layer in range(LAYERS):
        def mg(key, name):
            return states[key][f"decoder.layers.{layer}.{name}"]

        def hf(module, which):
            return peft[f"base_model.model.model.layers.{layer}.{module}.{which}.weight"]

        def projection(module, inp):
            return s * inp @ hf(module, "lora_A").T @ hf(module, "lora_B").T

        # linear_qkv: each rank's rows, concatenated and split per query group as the base weight is.
        parts = [(s * x @ mg((t, 0, 0), "self_attention.linear_qkv.lora_A.weight").T
                  @ mg((t, 0, 0), "self_attention.linear_qkv.lora_B.weight").T).T for t in range(tp)]
        q, k, v = GroupedQKV(HEADS, GROUPS, HEAD_DIM).merge(parts)
        for module, got in zip(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), (q, k, v)):
            assert_close(got.T, projection(module, x))
        # linear_fc1: [gate rows of rank t; up rows of rank t].
        halves = [(s * x @ mg((t, 0, 0), "mlp.linear_fc1.lora_A.weight").T
                   @ mg((t, 0, 0), "mlp.linear_fc1.lora_B.weight").T).chunk(2, dim=-1) for t in range(tp)]
        assert_close(torch.cat([h[0] for h in halves], -1), projection("mlp.gate_proj", x))
        assert_close(torch.cat([h[1] for h in halves], -1), projection("mlp.up_proj", x))
        # Row-parallel: each rank takes its slice of the input; partial outputs are summed (all-reduce).
        for linear, module, width in (("self_attention.linear_proj", "self_attn.o_proj", HEADS * HEAD_DIM),
                                      ("mlp.linear_fc2", "mlp.down_proj", FFN)):
            inp = torch.randn(3, width, generator=g)
            total = sum(s * inp.chunk(tp, -1)[t] @ mg((t, 0, 0), f"{linear}.lora_A.weight").T
                        @ mg((t, 0, 0), f"{linear}.lora_B.weight").T for t in range(tp))
            assert_close(total, projection(module, inp))


def test_export_after_import_is_the_adapter_at_tp2_pp2(tmp_path):
    from peft import LoraConfig

    _, peft = make_adapter(tmp_path / "a")
    layout = Layout(tp=2, pp=2)
    states = rank_states(tmp_path / "a", layout)
    out = tmp_path / "out"
    out.mkdir()
    names = write_peft_adapter(lambda key, name: states[key][name], lambda key, name: name in states[key], out,
                               "qwen3", CONFIG, layout, SETTINGS, base_model="/models/base")
    assert sorted(names) == sorted(peft)
    exported = PeftAdapter(out)
    for name, tensor in peft.items():
        assert torch.equal(exported.get(name), tensor), name
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (R, 16, "/models/base")
    loaded = LoraConfig.from_pretrained(str(out))
    assert (loaded.r, loaded.lora_alpha, loaded.task_type, loaded.bias) == (R, 16, "CAUSAL_LM", "none")


def test_virtual_pipeline_chunks_import_and_export_the_adapter(tmp_path):
    """PP2 x VPP2, 4 layers, TP2: each model chunk takes its adapter as the online import gives it (the chunk as a
    pipeline rank of the flat layout, Layout.stage numbering); rank files holding "model0"/"model1" as Megatron
    saves chunks export the adapter bit for bit; chunk 1 of pipeline rank 0 holds HF layer 2's adapter."""
    from adaptor.convert.lora import peft_adapter_from_rank_files
    from adaptor.convert.torch_legacy import rank_dir_name

    config = dict(CONFIG, num_hidden_layers=4)
    _, peft = make_adapter(tmp_path / "a", layers=4)
    layout, adapter = Layout(tp=2, pp=2, vpp=2), PeftAdapter(tmp_path / "a")
    flat = layout.flat()
    mapping = lora_mapping(model_mapping("qwen3", config), LINEARS)
    iteration = tmp_path / "ckpt" / "iter_0000001"
    for tp_rank in range(2):
        for pp_rank in range(2):
            chunks = {}
            for vp in range(2):
                stage = layout.stage(pp_rank, vp)
                names = {mapping.local_name(p, flat) for p in mapping.params(512) if mapping.stage_of(p, flat) == [stage]}
                chunks[f"model{vp}"] = dict(peft_rank_tensors(adapter, "qwen3", config, flat, tp_rank, stage, 0,
                                                              SETTINGS, names))
            folder = iteration / rank_dir_name(tp_rank, pp_rank, 0, 2, 1)
            folder.mkdir(parents=True)
            torch.save(chunks, folder / "model_optim_rng.pt")
            if (tp_rank, pp_rank) == (0, 0):
                a = chunks["model1"]["decoder.layers.0.self_attention.linear_qkv.lora_A.weight"]
                assert torch.equal(a, peft["base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight"])
    out = tmp_path / "out"
    names = peft_adapter_from_rank_files(iteration, out, "qwen3", config, layout, SETTINGS)
    assert sorted(names) == sorted(peft)
    exported = PeftAdapter(out)
    for name, tensor in peft.items():
        assert torch.equal(exported.get(name), tensor), name


def test_merging_each_rank_equals_merging_whole():
    """W + s*B@A on every TP rank's parts, gathered as the base weights are, is the merged full weight."""
    g = torch.Generator().manual_seed(2)
    s, tp = SETTINGS.scaling, 2
    qkv = GroupedQKV(HEADS, GROUPS, HEAD_DIM)
    w = [torch.randn(SHAPES[m], generator=g) for m in SHARED_A[0]]
    b = [torch.randn(SHAPES[m][0], R, generator=g) for m in SHARED_A[0]]
    a = torch.randn(R, HIDDEN, generator=g)
    w_o, a_o, b_o = torch.randn(HIDDEN, HEADS * HEAD_DIM, generator=g), torch.randn(R, HEADS * HEAD_DIM, generator=g), \
        torch.randn(HIDDEN, R, generator=g)
    parts_qkv, parts_o = [], []
    for t in range(tp):
        state = {"qkv.weight": qkv.shard(w, t, tp), "qkv.lora_A.weight": a, "qkv.lora_B.weight": qkv.shard(b, t, tp),
                 "proj.weight": w_o.chunk(tp, 1)[t], "proj.lora_A.weight": a_o.chunk(tp, 1)[t],
                 "proj.lora_B.weight": b_o}
        merged = merge_lora_state(state, {"qkv": s, "proj": s})
        assert sorted(merged) == ["proj.weight", "qkv.weight"]
        parts_qkv.append(merged["qkv.weight"])
        parts_o.append(merged["proj.weight"])
    for got, weight, lora_b in zip(qkv.merge(parts_qkv), w, b):
        assert_close(got, weight + s * lora_b @ a)
    assert_close(torch.cat(parts_o, 1), w_o + s * b_o @ a_o)


def test_separate_a_per_projection_is_refused(tmp_path):
    make_adapter(tmp_path / "a", separate_a=True)
    with pytest.raises(ConversionError) as info:
        rank_states(tmp_path / "a", Layout())
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight differs from "
                              "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), message


@pytest.mark.parametrize("change,expected", [
    ({"r": 8}, "r is 8 but --lora-r is 4"),
    ({"use_dora": True}, "use_dora: true (DoRA has a magnitude vector LoRA lacks) is not supported"),
    ({"target_modules": ["q_proj", "v_proj"]}, "target_modules adapts q_proj, v_proj but not k_proj"),
])
def test_adapters_megatron_cannot_hold_are_one_line(tmp_path, change, expected):
    path, _ = make_adapter(tmp_path / "a")
    config = json.loads((path / CONFIG_FILE).read_text())
    (path / CONFIG_FILE).write_text(json.dumps({**config, **change}))
    with pytest.raises(ConversionError) as info:
        adapter = PeftAdapter(path)
        adapter.linears()
        adapter.check_settings(SETTINGS)
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_target_modules_short_names_only_when_they_are_exact():
    every = [f"model.layers.{i}.self_attn.{p}.weight" for i in range(2) for p in ("q_proj", "o_proj")]
    adapted = [peft_name(w, "lora_A") for w in every if "q_proj" in w]
    assert target_modules(adapted, every) == ["q_proj"]
    one_layer = adapted[:1]
    assert target_modules(one_layer, every) == ["model.layers.0.self_attn.q_proj"]


@pytest.mark.parametrize("given,expected", [
    ({"hf_save_dir": None, "lora_r": 4}, "--hf-save-lora merged needs --hf-save-dir"),
    ({"hf_save_dir": "out", "lora_r": None}, "--hf-save-lora merged needs LoRA layers (--lora-r)"),
])
def test_hf_save_lora_needs_a_save_dir_and_lora(given, expected):
    import argparse

    from adaptor.features import ArgumentError
    from patches.hf.online_conversion import OnlineConversion

    args = argparse.Namespace(hf_load_dir=None, hf_save_lora="merged", model_type_hf="qwen3", num_layers=4,
                              pipeline_model_parallel_size=1, **given)
    with pytest.raises(ArgumentError) as info:
        OnlineConversion().validate(args, None)
    assert str(info.value) == expected


def test_parity_tool_lora_dir_bad_input(hf_dirs, tmp_path):
    from helpers.megatron_runs import ROOT
    from helpers.processes import run_tool

    proc = run_tool("check_hf_parity.py", "--hf-dir", hf_dirs["qwen3_tied"], "--lora-dir", tmp_path, cwd=ROOT,
                    timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"check_hf_parity.py: error: --lora-dir {tmp_path}: no "
                                                f"adapter_config.json there (not a PEFT adapter directory)"]
