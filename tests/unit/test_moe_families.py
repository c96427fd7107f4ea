"""Qwen3-MoE and Mixtral in this process: conversion round trips, the flags derived from config.json, and
what the converter refuses.

Reference points that do not come from the converter itself: transformers' ``save_pretrained`` output
(tests/helpers/hf_fixtures.py: 6 heads in 2 query groups of head_dim 12, 6 experts, top-2 and top-3),
transformers' own routers and decoder layers, and megatron-core's own routing function. Megatron's logits
and loss curves from these directories: tests/e2e/test_hf_parity.py and tests/e2e/test_moe_families.py.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from adaptor.convert import (
    ConversionError, HfCheckpoint, Layout, convert_hf_to_megatron, convert_megatron_to_hf,
    megatron_args_from_hf_config,
)
from helpers.hf_fixtures import HIDDEN_SIZE
from helpers.processes import import_tool

convert_ckpt = import_tool("convert_ckpt")
hf_model_flags = import_tool("hf_model_flags")

FAMILIES = {"qwen3_moe": "qwen3-moe", "mixtral": "mixtral"}


def config_of(hf_dirs, key) -> dict:
    return json.loads((hf_dirs[key] / "config.json").read_text())


def pairs(flags: list[str]) -> dict:
    return {f: (v if not v.startswith("--") else True) for f, v in zip(flags, flags[1:] + ["--"]) if f.startswith("--")}


# -- round trips ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("key,layout", [
    ("qwen3_moe", Layout()), ("qwen3_moe", Layout(2, 2, 2)), ("qwen3_moe", Layout(2, 1, 2, etp=1)),
    ("mixtral", Layout(2, 2)), ("mixtral", Layout(1, 2, 2)), ("mixtral", Layout(2, 1, 2, etp=1)),
])
@pytest.mark.parametrize("save_format", ["safetensors", "torch"])
def test_round_trip_is_bit_exact(hf_dirs, tmp_path, key, layout, save_format):
    src = hf_dirs[key]
    convert_hf_to_megatron(src, tmp_path / "mg", FAMILIES[key], layout, save_format=save_format)
    convert_megatron_to_hf(tmp_path / "mg", tmp_path / "hf", max_shard_bytes=100_000)
    before, after = HfCheckpoint(src), HfCheckpoint(tmp_path / "hf")
    assert sorted(after.names()) == sorted(before.names())
    for name in before.names():
        a, b = before.get(name), after.get(name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == config_of(hf_dirs, key)


def test_rank_files_hold_each_ranks_experts(hf_dirs, tmp_path):
    """EP2 with expert TP 1 at TP2: each EP rank holds 3 of the 6 experts, whole, as local experts 0..2; the dense
    layer 2 of Qwen3-MoE is a TP-split MLP, its MoE layers have a router and no linear_fc1 of their own."""
    from adaptor.convert import megatron_rank_tensors

    hf = HfCheckpoint(hf_dirs["qwen3_moe"])
    layout = Layout(2, 1, 2, etp=1)
    for ep_rank in range(2):
        for tp_rank in range(2):
            tensors = dict(megatron_rank_tensors(hf, "qwen3-moe", layout, tp_rank, 0, ep_rank))
            for local in range(3):
                e = 3 * ep_rank + local
                fc1 = tensors[f"decoder.layers.3.mlp.experts.local_experts.{local}.linear_fc1.weight"]
                gate = hf.get(f"model.layers.3.mlp.experts.{e}.gate_proj.weight")
                up = hf.get(f"model.layers.3.mlp.experts.{e}.up_proj.weight")
                assert torch.equal(fc1, torch.cat([gate, up]))
            assert "decoder.layers.3.mlp.experts.local_experts.3.linear_fc1.weight" not in tensors
            assert torch.equal(tensors["decoder.layers.3.mlp.router.weight"], hf.get("model.layers.3.mlp.gate.weight"))
            assert tensors["decoder.layers.2.mlp.linear_fc1.weight"].shape == (96, HIDDEN_SIZE)  # 2 x 96 / TP2
            assert "decoder.layers.2.mlp.router.weight" not in tensors
            assert "decoder.layers.1.mlp.linear_fc1.weight" not in tensors


def test_tp2_ep2_on_two_processes_exports(hf_dirs, tmp_path):
    """TP2 x EP2 with expert TP 1 on two processes saves ranks (tp 0, ep 0) and (tp 1, ep 1) only, as Megatron and
    --hf-save-dir's hand-over name them: each tensor is read where its part lives, and the export is exact. With
    expert TP 2 every pair holds its own part, and a missing one stays an error."""
    src = hf_dirs["qwen3_moe"]
    for etp in (1, None):
        mg = convert_hf_to_megatron(src, tmp_path / f"mg{etp}", "qwen3-moe", Layout(2, 1, 2, etp=etp),
                                    save_format="torch")
        for pair in ("mp_rank_00_001", "mp_rank_01_000"):
            shutil.rmtree(mg / "release" / pair)
        if etp is None:
            with pytest.raises(ConversionError, match="mp_rank_01_000"):
                convert_megatron_to_hf(mg, tmp_path / "hf_etp2")
            continue
        convert_megatron_to_hf(mg, tmp_path / "hf")
        before, after = HfCheckpoint(src), HfCheckpoint(tmp_path / "hf")
        assert sorted(after.names()) == sorted(before.names())
        assert all(torch.equal(before.get(n), after.get(n)) for n in before.names())


def test_offline_command_line_takes_mindspeed_llms_names(hf_dirs, tmp_path, capsys):
    """tools/convert_ckpt.py --model-type-hf qwen3-moe / mixtral (MindSpeed-LLM's names), and back without it."""
    for key, kind in FAMILIES.items():
        out = tmp_path / key
        code = convert_ckpt.main(["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", kind,
                                  "--load-dir", str(hf_dirs[key]), "--save-dir", str(out / "mg"),
                                  "--target-expert-parallel-size", "2"])
        assert code == 0, capsys.readouterr().err
        code = convert_ckpt.main(["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(out / "mg"),
                                  "--save-dir", str(out / "hf")])
        assert code == 0, capsys.readouterr().err
        assert sorted(HfCheckpoint(out / "hf").names()) == sorted(HfCheckpoint(hf_dirs[key]).names())


# -- the architecture from config.json ----------------------------------------------------------------

@pytest.mark.parametrize("step,dense", [(1, []), (2, []), (1, [0, 3]), (2, [1]), (3, [])])
def test_moe_layer_freq_is_transformers_layer_choice(step, dense):
    """--moe-layer-freq from decoder_sparse_step and mlp_only_layers marks exactly the layers transformers'
    Qwen3MoeDecoderLayer builds as sparse blocks."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
                            num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=4, num_experts_per_tok=2, decoder_sparse_step=step, mlp_only_layers=dense)
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(config)
    built = [int(isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)) for layer in model.model.layers]
    flags = pairs(megatron_args_from_hf_config("qwen3-moe", config.to_dict()))
    assert eval(flags["--moe-layer-freq"]) == built


@pytest.mark.parametrize("family,norm", [("qwen3_moe", False), ("qwen3_moe", True), ("mixtral", None)])
def test_derived_router_flags_route_as_transformers(hf_dirs, family, norm):
    """megatron-core's routing function with the derived flags picks transformers' experts with its weights:
    norm_topk_prob false is --moe-router-pre-softmax, true (and Mixtral) Megatron's default. The two differ."""
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
    from transformers import AutoConfig

    config = config_of(hf_dirs, family)
    if norm is not None:
        config["norm_topk_prob"] = norm
    flags = pairs(megatron_args_from_hf_config(FAMILIES[family], config))
    hf_config = AutoConfig.for_model(**config)
    if family == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter as Router
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter as Router
    router = Router(hf_config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=generator))
        hidden = torch.randn(40, HIDDEN_SIZE, generator=generator)
        logits, weights, indices = router(hidden)
    expected = torch.zeros_like(logits).scatter(1, indices, weights)
    topk = int(flags["--moe-router-topk"])
    probs, routing_map = topk_routing_with_score_function(logits, topk, use_pre_softmax="--moe-router-pre-softmax"
                                                          in flags, score_function=flags["--moe-router-score-function"])
    assert torch.equal(routing_map, expected > 0)
    torch.testing.assert_close(probs, expected, rtol=1e-6, atol=1e-7)
    other, _ = topk_routing_with_score_function(logits, topk, use_pre_softmax="--moe-router-pre-softmax" not in flags,
                                                score_function="softmax")
    assert (other - expected).abs().max() > 1e-2  # the other setting would route with other weights


def test_hf_model_type_and_flags_tool(hf_dirs, capsys):
    """config.json's model_type names the family; tools/hf_model_flags.py prints its flags."""
    from adaptor.convert.config_check import hf_model_type

    for key, kind in FAMILIES.items():
        assert hf_model_type(config_of(hf_dirs, key), None, "here") == kind
        assert hf_model_flags.main([str(hf_dirs[key])]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == "512" and lines[lines.index("--num-experts") + 1] == "6"
        assert ("--qk-layernorm" in lines) == (key == "qwen3_moe")
        assert ("--moe-router-pre-softmax" in lines) == (key == "qwen3_moe")  # its norm_topk_prob is false


@pytest.mark.parametrize("drop,add,flag", [
    (["--moe-router-pre-softmax"], [], "--moe-router-pre-softmax is False on the command line but True"),
    (["--moe-layer-freq"], ["--moe-layer-freq", "1"], "--moe-layer-freq is [1, 1, 1, 1] on the command line but "
                                                      "[1, 1, 0, 1]"),
    (["--qk-layernorm"], [], "--qk-layernorm is False on the command line but True"),
    (["--moe-router-topk"], ["--moe-router-topk", "3"], "--moe-router-topk is 3 on the command line but 2"),
    ([], ["--moe-grouped-gemm", "--moe-router-dtype", "fp64"], None),  # how, not what, is computed
])
def test_hf_load_dir_check_names_the_flag(hf_dirs, drop, add, flag):
    """--hf-load-dir compares the command line with the flags config.json implies: Qwen3-MoE's routing and layer
    pattern are part of the architecture."""
    from adaptor.convert.config_check import config_mismatch, megatron_namespace

    derived = megatron_args_from_hf_config("qwen3-moe", config_of(hf_dirs, "qwen3_moe"))
    given = []
    for f, v in zip(derived, derived[1:] + ["--"]):
        if f.startswith("--") and f not in drop:
            given += [f] + ([] if v.startswith("--") else [v])
    args, _, _ = megatron_namespace(given + add)
    mismatch = config_mismatch(args, derived)
    assert mismatch == flag if flag is None else mismatch.startswith(flag), mismatch


@pytest.mark.parametrize("key", list(FAMILIES))
def test_config_written_from_the_flags_describes_the_same_model(hf_dirs, key):
    """--hf-save-dir without --hf-load-dir writes config.json from the flags: transformers reads it as the same
    architecture, and it derives the same flags back."""
    from transformers import AutoConfig

    from adaptor.convert.config_check import megatron_namespace
    from adaptor.convert.online import hf_config_from_args

    flags = megatron_args_from_hf_config(FAMILIES[key], config_of(hf_dirs, key))
    args, _, _ = megatron_namespace(flags)
    args.model_type_hf, args.padded_vocab_size, args.bf16, args.fp16 = FAMILIES[key], None, False, False
    written = hf_config_from_args(args)
    assert megatron_args_from_hf_config(FAMILIES[key], written) == flags
    loaded = AutoConfig.for_model(**written).to_dict()
    for name, value in config_of(hf_dirs, key).items():
        if name in ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "intermediate_size", "head_dim", "num_key_value_heads", "norm_topk_prob", "mlp_only_layers",
                    "decoder_sparse_step", "rope_parameters", "sliding_window", "tie_word_embeddings"):
            assert loaded[name] == value, name


# -- bad input, one line each --------------------------------------------------------------------------

def with_config(hf_dirs, tmp_path, key, **changes):
    src = shutil.copytree(hf_dirs[key], tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    for name, value in changes.items():
        if value is None:
            config.pop(name, None)
        else:
            config[name] = value
    (src / "config.json").write_text(json.dumps(config))
    return src


def convert_fails(src, kind, tmp_path, capsys, *flags):
    (tmp_path / "out").mkdir()
    code = convert_ckpt.main(["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", kind,
                              "--load-dir", str(src), "--save-dir", str(tmp_path / "out" / "mg"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith("convert_ckpt.py: error: "), err
    assert list((tmp_path / "out").iterdir()) == []
    return err[0]


@pytest.mark.parametrize("key,changes,needle", [
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise=0.1 is not supported"),
    ("mixtral", {"sliding_window": 4096}, "sliding_window=4096 is not supported"),
    ("mixtral", {"mlp_only_layers": [1]}, "mlp_only_layers is not a mixtral setting"),
    ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window=true"),
    ("qwen3_moe", {"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    ("qwen3_moe", {"attention_bias": True}, "attention_bias=True is not supported for qwen3-moe"),
    ("qwen3_moe", {"num_experts": None, "num_local_experts": None}, "no value for 'num_experts'"),
    ("qwen3_moe", {"mlp_only_layers": [0, 1, 2, 3]}, "leave no MoE layer"),
    ("qwen3_moe", {"num_experts_per_tok": 7}, "num_experts_per_tok=7"),
])
def test_config_we_cannot_build_is_one_line(hf_dirs, tmp_path, capsys, key, changes, needle):
    src = with_config(hf_dirs, tmp_path, key, **changes)
    line = convert_fails(src, FAMILIES[key], tmp_path, capsys)
    assert needle in line, line


@pytest.mark.parametrize("flags,needle", [
    (["--target-expert-parallel-size", "4"], "6 routed experts are not divisible by --target-expert-parallel-size 4"),
    (["--target-tensor-parallel-size", "4"], "num_key_value_heads (query groups)=2 is not divisible"),
    (["--target-pipeline-parallel-size", "3"], "num_hidden_layers=4 is not divisible"),
])
def test_layout_that_cannot_split(hf_dirs, tmp_path, capsys, flags, needle):
    line = convert_fails(hf_dirs["qwen3_moe"], "qwen3-moe", tmp_path, capsys, *flags)
    assert needle in line, line


def test_missing_shard(hf_dirs, tmp_path, capsys):
    src = shutil.copytree(hf_dirs["qwen3_moe"], tmp_path / "src")
    (src / "model-00002-of-00002.safetensors").unlink()
    line = convert_fails(src, "qwen3-moe", tmp_path, capsys)
    assert "model-00002-of-00002.safetensors: missing shard" in line, line


@pytest.fixture(scope="module")
def fused_dirs(hf_dirs, tmp_path_factory):
    """The fixtures as transformers lays experts out in memory: save_pretrained(save_original_format=False) writes
    ``mlp.gate`` and per layer 3-D ``mlp.experts.gate_up_proj`` / ``down_proj`` (Mixtral's ``block_sparse_moe``
    renamed)."""
    from transformers import AutoModelForCausalLM

    out = {}
    for key in FAMILIES:
        out[key] = tmp_path_factory.mktemp("fused") / key
        AutoModelForCausalLM.from_pretrained(hf_dirs[key], dtype=torch.float32).save_pretrained(
            out[key], save_original_format=False)
    return out


@pytest.mark.parametrize("key", list(FAMILIES))
def test_transformers_fused_expert_layout_reads_as_the_hub_one(hf_dirs, fused_dirs, tmp_path, key):
    """Every rank's tensors at TP2 x EP2 from transformers' fused layout are those of the Hub layout, and the
    export (the Hub layout, as save_pretrained writes by default) is the Hub directory bit for bit."""
    from adaptor.convert import megatron_rank_tensors

    fused, hub = HfCheckpoint(fused_dirs[key]), HfCheckpoint(hf_dirs[key])
    assert any(n.endswith(".mlp.experts.gate_up_proj") for n in fused.names())
    layout = Layout(2, 1, 2)
    for tp_rank, pp_rank, ep_rank in layout.rank_keys():
        got = dict(megatron_rank_tensors(fused, FAMILIES[key], layout, tp_rank, pp_rank, ep_rank))
        want = dict(megatron_rank_tensors(hub, FAMILIES[key], layout, tp_rank, pp_rank, ep_rank))
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[n], want[n]) for n in want)
    convert_hf_to_megatron(fused_dirs[key], tmp_path / "mg", FAMILIES[key], layout, save_format="torch")
    convert_megatron_to_hf(tmp_path / "mg", tmp_path / "hf")
    back = HfCheckpoint(tmp_path / "hf")
    assert sorted(back.names()) == sorted(hub.names())
    assert all(torch.equal(back.get(n), hub.get(n)) for n in hub.names())


def test_fused_experts_that_do_not_fit_the_config(fused_dirs, tmp_path, capsys):
    src = shutil.copytree(fused_dirs["mixtral"], tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    config["num_local_experts"] = 5
    (src / "config.json").write_text(json.dumps(config))
    line = convert_fails(src, "mixtral", tmp_path, capsys)
    assert "model.layers.0.mlp.experts.gate_up_proj [6, 80, 64] do not fit config.json (not [5 experts" in line, line


@pytest.mark.parametrize("key,changes,needle", [
    ("qwen3_moe", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}},
     "rope_scaling type 'dynamic' has no Megatron equivalent"),
    ("mixtral", {"rope_parameters": {"rope_type": "longrope", "factor": 2.0, "rope_theta": 1e6}},
     "rope_scaling type 'longrope' has no Megatron equivalent"),
])
def test_flags_refuse_rope_scaling_we_do_not_build(hf_dirs, tmp_path, capsys, key, changes, needle):
    """--hf-load-dir and tools/hf_model_flags.py derive the flags: a RoPE Megatron does not build is one line."""
    src = with_config(hf_dirs, tmp_path, key, **changes)
    capsys.readouterr()  # transformers' progress bar, where this test wrote the model first
    with pytest.raises(ConversionError, match=needle):
        megatron_args_from_hf_config(FAMILIES[key], json.loads((src / "config.json").read_text()))
    assert hf_model_flags.main([str(src)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_mindspeed_llms_mixtral_script_builds_the_converted_architecture():
    """pretrain_mixtral_8x7b_ptd.sh's flags (32 layers / 4096 hidden / 32 heads / 8 groups, 8 experts top-2, its
    ``--moe-layer-freq -1 --first-k-dense-replace -1``; sizes scaled), rewritten as a pretrain_gpt.py command line
    is, describe the model the flags derived from a Mixtral config.json of those sizes build: --hf-load-dir accepts
    it. Megatron's defaults that validation fills in (kv channels, expert FFN size) are set as it sets them."""
    from transformers import MixtralConfig

    from adaptor.command_line.mindspeed_llm import rewrite_pretrain_argv
    from adaptor.convert.config_check import config_mismatch, megatron_namespace

    moe = ["--num-experts", "6", "--expert-model-parallel-size", "1", "--moe-router-topk", "3",
           "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.02",
           "--moe-permutation-async-comm", "--moe-token-dispatcher-type", "alltoall_seq", "--moe-grouped-gemm",
           "--moe-layer-freq", "-1", "--first-k-dense-replace", "-1", "--use-cp-send-recv-overlap"]
    gpt = ["--use-mcore-models", "--disable-bias-linear", "--seq-length", "64", "--max-position-embeddings", "64",
           "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "40", "--num-attention-heads", "4",
           "--init-method-std", "0.01", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
           "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--swiglu",
           "--untie-embeddings-and-output-weights", "--group-query-attention", "--num-query-groups", "2",
           "--vocab-size", "512", "--rotary-base", "1000000", "--no-masked-softmax-fusion",
           "--use-fused-rotary-pos-emb", "--use-flash-attn", "--use-fused-swiglu", "--use-fused-rmsnorm",
           "--no-check-for-nan-in-loss-and-grad", "--overlap-grad-reduce", "--overlap-param-gather",
           "--make-vocab-size-divisible-by", "1", "--tensor-model-parallel-size", "2",
           "--pipeline-model-parallel-size", "1", "--sequence-parallel", "--use-distributed-optimizer",
           "--context-parallel-size", "1", "--context-parallel-algo", "megatron_cp_algo",
           "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", "tokenizer.model", "--micro-batch-size", "1",
           "--global-batch-size", "8", "--lr", "1e-5", "--train-iters", "4", "--lr-decay-iters", "4",
           "--lr-decay-style", "cosine", "--min-lr", "1.0e-6", "--weight-decay", "0.1", "--lr-warmup-iters", "2",
           "--clip-grad", "1.0", "--bf16", "--no-load-optim", "--no-load-rng", "--no-shared-storage"]
    rewritten = rewrite_pretrain_argv(moe + gpt)
    assert not rewritten.refused and "--first-k-dense-replace -1: --moe-layer-freq [1,1,1,1]" in rewritten.notes
    args, _, _ = megatron_namespace(rewritten.argv)
    args.kv_channels, args.moe_ffn_hidden_size = args.hidden_size // args.num_attention_heads, args.ffn_hidden_size
    config = MixtralConfig(vocab_size=512, hidden_size=64, intermediate_size=40, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=6, num_experts_per_tok=3,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                           tie_word_embeddings=False).to_dict()
    derived = megatron_args_from_hf_config("mixtral", config)
    assert config_mismatch(args, derived) is None
    args.moe_router_pre_softmax = True  # what the script does not say would be named
    assert config_mismatch(args, derived).startswith("--moe-router-pre-softmax is True on the command line")
