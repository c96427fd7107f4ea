"""LoRA on megatron-core's own linears, in one process (and one TP=2 torchrun of tests/scripts/lora_tp_parity.py).

Each model here is a real megatron-core TransformerBlock built from the local layer spec with the
feature's ``module_swaps`` rows, as pretrain_gpt.py builds its layers:

* zero-initialised B leaves every output equal to the base model's, bit for bit;
* only adapters require grad after freezing, and only targeted linears carry adapters;
* merged weights (``W + alpha/r * B @ A``) give the unmerged output (fp32; rtol 1e-5 leaves room for
  the other order of the sums only) and unmerging restores the weights;
* the adapters' sharded state (SwiGLU's fc1 B stored in halves as its weight), the base-only /
  adapters-only views of it, and the load checks' one-line reasons;
* MLA's five linears and linear_proj take adapters and gradients;
* the column/row parallel layout at TP=2 (plain, sequence parallel, MoE experts) against the layer
  computed whole, and the sharded axes of each adapter;
* flags: MindSpeed-LLM's names, defaults and refusals, each one line.
"""
from __future__ import annotations

import argparse
import functools
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from helpers.megatron_runs import launch

os.environ.setdefault("ADAPTOR_BACKEND", "cpu")


from adaptor import run_state
from adaptor.features import ArgumentError, FeatureContext, explicit_dests  # noqa: E402
from adaptor.lora import is_lora_name  # noqa: E402
from patches.finetune.lora import Lora  # noqa: E402

S, B, H, FFN, R, ALPHA = 8, 2, 32, 64, 4, 8.0
ALL = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def transformer_config(mla: bool = False):
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    common = dict(num_layers=2, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=4, qk_layernorm=True,
                  normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                  attention_dropout=0.0, hidden_dropout=0.0, bias_activation_fusion=False,
                  use_cpu_initialization=True)
    if mla:
        return MLATransformerConfig(**common, multi_latent_attention=True, q_lora_rank=16, kv_lora_rank=12,
                                    qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8, rope_type="rope",
                                    masked_softmax_fusion=False)
    return TransformerConfig(**common, num_query_groups=2, kv_channels=8)


def build(targets=ALL, r=R, mla=False, seed=1234):
    """A two-layer Qwen3-like block (or DeepSeek-like MLA block) with the feature's swaps and these targets."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_block import TransformerBlock

    from adaptor.layer_specs import module_swaps, swap_modules
    from adaptor.lora.layers import LoraConfig, building
    from patches.models.mla import MlaWithoutTransformerEngine

    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm", multi_latent_attention=mla)
    flags = SimpleNamespace(lora_r=r if targets else None, multi_latent_attention=mla)
    spec = swap_modules(spec, module_swaps(flags, [MlaWithoutTransformerEngine(), Lora()]))
    model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)
    with building(LoraConfig(r, ALPHA, 0.0, tuple(targets)) if targets else None):
        return TransformerBlock(transformer_config(mla), spec)


def adapted(block) -> dict:
    from adaptor.lora.model import adapted_linears

    return adapted_linears(block)


def randomize_b(block, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for linear in adapted(block).values():
            linear.lora_B.weight.copy_(torch.randn(linear.lora_B.weight.shape, generator=g) * 0.1)


def hidden(seed=0):
    return torch.randn(S, B, H, generator=torch.Generator().manual_seed(seed))


def test_zero_b_leaves_the_base_output_unchanged(model_parallel):
    plain, lora = build(targets=()), build()
    assert not adapted(plain) and len(adapted(lora)) == 8
    missing, unexpected = lora.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(is_lora_name(k) for k in missing)
    assert torch.equal(lora(hidden(), attention_mask=None), plain(hidden(), attention_mask=None))


def test_only_adapters_of_the_targets_require_grad(model_parallel):
    from adaptor.lora.model import freeze_all_but_adapters, parameter_counts

    block = build(targets=("linear_qkv", "linear_fc2"))
    freeze_all_but_adapters(block)
    trainable = {n for n, p in block.named_parameters() if p.requires_grad}
    assert trainable == {f"layers.{i}.{m}.{p}.weight" for i in range(2)
                         for m in ("self_attention.linear_qkv", "mlp.linear_fc2") for p in ("lora_A", "lora_B")}
    assert {linear.lora_target for linear in adapted(block).values()} == {"linear_qkv", "linear_fc2"}
    proj = block.layers[0].self_attention.linear_proj
    assert proj.lora_module_name == "linear_proj" and not proj.has_adapters and proj.lora_A is None
    qkv = block.layers[0].self_attention.linear_qkv
    assert (qkv.lora_r, qkv.lora_alpha, qkv.lora_scaling) == (R, ALPHA, ALPHA / R)
    assert isinstance(qkv.lora_A, torch.nn.Linear) and qkv.lora_A.bias is None
    assert not qkv.lora_B.weight.any(), "lora_B starts at zero"
    trained, total = parameter_counts(block)
    assert trained == sum(p.numel() for n, p in block.named_parameters() if is_lora_name(n)) < total
    x = hidden().requires_grad_(True)
    block(x, attention_mask=None).sum().backward()
    grads = {n for n, p in block.named_parameters() if p.grad is not None}
    assert grads == trainable
    assert qkv.lora_B.weight.grad.abs().sum() > 0  # B = 0: A's gradient is zero at the start, B's is not


def test_merged_weights_give_the_unmerged_output(model_parallel):
    from adaptor.lora.model import merged

    block = build()
    randomize_b(block)
    weights = {n: p.detach().clone() for n, p in block.named_parameters()}
    with torch.no_grad():
        unmerged = block(hidden(), attention_mask=None)
        with merged(block):
            assert all(linear.lora_merged for linear in adapted(block).values())
            merged_out = block(hidden(), attention_mask=None)
        torch.testing.assert_close(merged_out, unmerged, rtol=1e-5, atol=1e-5)
    for name, param in block.named_parameters():
        torch.testing.assert_close(param, weights[name], rtol=0, atol=1e-6)
    for linear in adapted(block).values():
        assert linear.lora_delta().shape == linear.weight.shape


def test_adapters_start_from_seed_and_place_not_from_the_build_order(model_parallel):
    from adaptor.lora.model import initialize_adapters, layout_free_name

    one, two = build(seed=1), build(seed=2)  # base weights and construction-time A differ
    initialize_adapters(one, 1234)
    initialize_adapters(two, 1234)
    a = {n: p for n, p in one.named_parameters() if is_lora_name(n)}
    b = {n: p for n, p in two.named_parameters() if is_lora_name(n)}
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["layers.0.mlp.linear_fc1.lora_A.weight"], a["layers.1.mlp.linear_fc1.lora_A.weight"])
    assert layout_free_name(one, "layers.1.mlp.linear_fc1") == "layers.layer2.mlp.linear_fc1"


def test_sharded_state_and_its_base_and_adapter_views(model_parallel):
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    from adaptor.lora import checkpoint

    block = build()
    meta = {"dp_cp_group": ps.get_data_parallel_group(with_context_parallel=True)}
    state = block.sharded_state_dict(metadata=meta)
    fc1_b = state["layers.0.mlp.linear_fc1.lora_B.weight"]
    assert isinstance(fc1_b, ShardedTensorFactory)  # SwiGLU's [gate; up] rows, stored as the weight is
    qkv_a = state["layers.0.self_attention.linear_qkv.lora_A.weight"]
    assert isinstance(qkv_a, ShardedTensor) and qkv_a.key == "layers.self_attention.linear_qkv.lora_A.weight"
    assert qkv_a.global_shape == (2, R, H)  # stacked over the layers like the base weights
    adapters = checkpoint.views([block], checkpoint.ADAPTERS)[0].sharded_state_dict(metadata=meta)
    base = checkpoint.views([block], checkpoint.BASE)[0].sharded_state_dict(metadata=meta)
    assert set(adapters) == {k for k in state if is_lora_name(k)} and len(adapters) == 16
    assert set(base) == set(state) - set(adapters)
    assert set(checkpoint.views([block], checkpoint.ADAPTERS)[0].state_dict_for_save_checkpoint()) == {
        k for k in block.state_dict() if is_lora_name(k)}


def _request(block):
    from megatron.core import parallel_state as ps

    return {"model": block.sharded_state_dict(metadata={"dp_cp_group": ps.get_data_parallel_group(
        with_context_parallel=True)})}


def test_load_checks_name_the_tensor_in_one_line(model_parallel):
    from megatron.core.dist_checkpointing.dict_utils import nested_values

    from adaptor.lora import checkpoint
    from adaptor.lora.checkpoint import AdapterCheckpointError, _model_tensors, check_load

    block = build()
    request = _request(block)
    saved = {t.key: tuple(t.global_shape) for t in _model_tensors(request)}
    adapters = {k: v for k, v in saved.items() if is_lora_name(k)}
    base = {k: v for k, v in saved.items() if not is_lora_name(k)}
    assert len(list(nested_values(request))) > len(adapters)
    check_load(request, adapters, checkpoint.ADAPTERS)
    check_load(request, base, checkpoint.BASE)
    qkv_a = "layers.self_attention.linear_qkv.lora_A.weight"
    cases = [
        ({**adapters, qkv_a: (2, 8, H)}, checkpoint.ADAPTERS,
         f"tensor {qkv_a} has shape [2, 8, 32] in the checkpoint but [2, 4, 32] in this model: the adapters have "
         f"rank 8; pass --lora-r 8"),
        ({**adapters, qkv_a: (2, R, 48)}, checkpoint.ADAPTERS, "trained on a base model of another shape"),
        ({k: v for k, v in adapters.items() if "linear_fc2" not in k}, checkpoint.ADAPTERS,
         "its adapters are on linear_fc1, linear_proj, linear_qkv, this run's on linear_fc1, linear_fc2"),
        ({**adapters, "layers.mlp.linear_fc3.lora_A.weight": (2, R, H)}, checkpoint.ADAPTERS,
         "the checkpoint has layers.mlp.linear_fc3.lora_A.weight, which this run does not build"),
        (base, checkpoint.ADAPTERS, "the checkpoint has no adapters"),
        (adapters, checkpoint.BASE, "holds LoRA adapters, not a base model"),
    ]
    for shapes, mode, reason in cases:
        with pytest.raises(AdapterCheckpointError) as info:
            check_load(request, shapes, mode)
        assert reason in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_one_part_load_expects_the_other_part_absent(model_parallel):
    from adaptor.lora import checkpoint

    block = build()
    block.register_load_state_dict_post_hook(checkpoint.after_load)
    state = block.state_dict()
    adapters = {k: v for k, v in state.items() if is_lora_name(k)}
    with checkpoint.loading(checkpoint.BASE):
        block.load_state_dict({k: v for k, v in state.items() if k not in adapters}, strict=True)
    with checkpoint.loading(checkpoint.ADAPTERS):
        block.load_state_dict(adapters, strict=True)
        partial = {k: v for k, v in adapters.items() if "linear_fc2" not in k}
        with pytest.raises(checkpoint.AdapterCheckpointError, match="has no layers.0.mlp.linear_fc2.lora_A.weight"):
            block.load_state_dict(partial, strict=True)
    with pytest.raises(RuntimeError, match="Missing key"):  # outside a LoRA load nothing is excused
        block.load_state_dict(adapters, strict=True)


def test_mla_linears_take_adapters(model_parallel):
    from adaptor.patch_manager import PatchManager
    from patches.finetune import lora as feature

    pm = PatchManager()
    pm.register_wrapper("megatron.core.transformer.multi_latent_attention.MLASelfAttention.__init__",
                        feature._mla_init, "test")
    pm.apply()
    try:
        targets = ("linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj",
                   "linear_proj")
        block = build(targets=targets, mla=True)
    finally:
        pm.remove()
    from adaptor.lora.model import freeze_all_but_adapters

    assert {linear.lora_target for linear in adapted(block).values()} == set(targets)
    freeze_all_but_adapters(block)
    randomize_b(block)
    block(hidden(), attention_mask=None).square().sum().backward()
    for name, linear in adapted(block).items():
        assert linear.lora_A.weight.grad.abs().sum() > 0 and linear.lora_B.weight.grad.abs().sum() > 0, name


def test_tensor_parallel_layout_matches_the_whole_layer():
    out = launch("tests/scripts/lora_tp_parity.py", nproc=2, env={"ADAPTOR_QUIET": "1"}, timeout=300)
    assert out.returncode == 0, out.output[-4000:]
    cases = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("CASE") and line.endswith(" ok")]
    assert cases == [f"{k}_{c}" for k in ("column", "row") for c in ("plain", "sequence_parallel", "expert")] + [
        "sharded_state_dict"], out.stdout


# ----------------------------------------------------------------------------- flags
@functools.lru_cache(maxsize=1)
def megatron_parser():
    from megatron.training import arguments as margs

    parser = margs.add_megatron_arguments(argparse.ArgumentParser())
    Lora().add_arguments(parser.add_argument_group("lora"))
    return parser


def checked(*argv):
    """Megatron's parser, the cpu backend's transformer_impl, then the feature's defaults and checks."""
    parser = megatron_parser()
    args = parser.parse_args(list(argv))
    ctx = FeatureContext(backend=run_state.backend(), flags=args, explicit=explicit_dests(parser, argv), argv=list(argv))
    feature = Lora()
    feature.set_defaults(args, ctx)
    feature.validate(args, ctx)
    return args, feature.enabled(ctx)


def test_mindspeed_llm_flags_and_defaults():
    args, enabled = checked("--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2",
                            "--lora-fusion", "--lora-ckpt-filter")
    assert enabled and (args.lora_r, args.lora_alpha, args.lora_dropout) == (16, 32.0, 0.0)
    assert args.transformer_impl == "local"  # megatron's default (transformer_engine) is not adapted
    args, _ = checked("--lora-r", "8")
    assert args.lora_target_modules == list(ALL) and (args.lora_r, args.lora_alpha) == (8, 32.0)
    args, enabled = checked("--num-layers", "2")
    assert not enabled and args.lora_r is None and args.lora_target_modules == []
    args, _ = checked("--lora-r", "0")
    assert not args.lora_r  # an explicit rank 0 is LoRA off


@pytest.mark.parametrize("argv, reason", [
    (["--lora-load", "x"], "--lora-load needs LoRA layers: add --lora-target-modules"),
    (["--lora-r", "4", "--lora-target-modules", "q_proj"], "--lora-target-modules q_proj: not a linear LoRA adapts"),
    (["--lora-target-modules", "linear_q_down_proj"], "this model has no linear_q_down_proj (it is an MLA linear)"),
    (["--lora-target-modules", "linear_qkv", "--multi-latent-attention"], "this model has no linear_qkv"),
    (["--lora-target-modules", "linear_q_proj", "--multi-latent-attention", "--q-lora-rank", "8"],
     "without --q-lora-rank"),
    (["--lora-target-modules", "linear_fc1", "--lora-r", "0"], "--lora-r must be at least 1"),
    (["--lora-r", "4", "--lora-dropout", "1.0"], "--lora-dropout is a probability"),
    (["--lora-r", "4", "--lora-alpha", "0"], "--lora-alpha must be positive"),
    (["--lora-r", "4", "--transformer-impl", "transformer_engine"], "use --transformer-impl local"),
    (["--lora-r", "4", "--use-torch-fsdp2"], "not supported with --use-torch-fsdp2"),
    (["--lora-r", "4", "--num-experts", "4", "--moe-grouped-gemm"], "drop --moe-grouped-gemm"),
    (["--lora-r", "4", "--ckpt-format", "torch_dcp"], "--ckpt-format torch_dcp is not supported"),
    (["--lora-r", "4", "--freeze-all-layers"], "--freeze-all-layers would freeze the adapters too"),
    (["--lora-r", "4", "--qlora"], "--qlora: 4-bit quantized base weights (QLoRA) are not supported"),
    (["--lora-r", "4", "--lora-modules-to-save", "word_embeddings"], "--lora-modules-to-save: only the adapters"),
])
def test_bad_lora_flags_are_one_line(argv, reason):
    with pytest.raises(ArgumentError) as info:
        checked(*argv)
    assert reason in str(info.value) and "\n" not in str(info.value), str(info.value)
