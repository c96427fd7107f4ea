"""Recompute on the local spec, in one process: what a real megatron-core TransformerBlock keeps for backward.

Each case builds the same two-layer block (same seed, so the same weights) with and without a
recompute setting, runs forward and backward on the same input, and checks two things:

* the bytes held by the tensors autograd saved (``torch.autograd.graph.saved_tensors_hooks``,
  counted after the forward, when a discarded output's storage has been freed) fall by at least
  what that recompute drops: a flag that did nothing fails here;
* the gradients of the input and of every weight equal the plain block's (fp32, same operations:
  rtol 1e-5 leaves room only for gradient sums taken in another order).

Bad command lines (``Recompute.validate``) end in one line each.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch


os.environ.setdefault("ADAPTOR_BACKEND", "cpu")

from adaptor.features import ArgumentError  # noqa: E402
from helpers.blocks import B, FFN, H, S, build  # noqa: E402
from patches.memory.recompute import Recompute  # noqa: E402

FLOAT = 4




def saved_bytes_and_grads(block):
    torch.manual_seed(0)
    x = torch.randn(S, B, H, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = block(x, attention_mask=None)
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in saved}
    out.square().sum().backward()
    grads = {"input": x.grad} | {name: p.grad.clone() for name, p in block.named_parameters()}
    block.zero_grad()
    return sum(storages.values()), grads


def assert_same_grads(grads, reference):
    assert grads.keys() == reference.keys()
    for name, ref in reference.items():
        torch.testing.assert_close(grads[name], ref, rtol=1e-5, atol=1e-7, msg=name)


# (setting, bytes it must drop at least): per layer, the norms' outputs [S, B, H]; the activation's
# output [S, B, FFN]; full recompute keeps only each layer's input.
NORMS = 2 * 2 * S * B * H * FLOAT
ACTIVATION = 2 * S * B * FFN * FLOAT
CASES = {
    "recompute_norm": (dict(mindspeed=("recompute_norm",)), NORMS),
    "megatron_layernorm": (dict(recompute_granularity="selective", recompute_modules=["layernorm"]), NORMS),
    "recompute_activation_function": (dict(mindspeed=("recompute_activation_function",)), ACTIVATION),
    "full": (dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
             10 * S * B * H * FLOAT),
}


@pytest.mark.parametrize("case", CASES)
def test_recompute_drops_saved_activations_and_keeps_gradients(case, model_parallel):
    kwargs, at_least = CASES[case]
    plain_bytes, plain_grads = saved_bytes_and_grads(build())
    block = build(**kwargs)
    block.train()
    bytes_, grads = saved_bytes_and_grads(block)
    assert plain_bytes - bytes_ >= at_least, f"{case}: saved {bytes_} bytes vs {plain_bytes} without it"
    assert_same_grads(grads, plain_grads)


def test_moe_act_recomputes_local_grouped_experts(model_parallel):
    """``--recompute-modules moe_act`` on the adaptor's GroupedExperts (upstream covers TE's experts only)."""
    plain_bytes, plain_grads = saved_bytes_and_grads(build(num_experts=2))
    block = build(num_experts=2, recompute_granularity="selective", recompute_modules=["moe_act"])
    bytes_, grads = saved_bytes_and_grads(block)
    # every token goes to one expert (top-1): the experts' activation outputs are [S*B, FFN] per layer
    assert plain_bytes - bytes_ >= 2 * S * B * FFN * FLOAT, (bytes_, plain_bytes)
    assert_same_grads(grads, plain_grads)


def args(**given):
    base = dict(num_layers=4, recompute_granularity=None, recompute_method=None, recompute_modules=None,
                recompute_activations=False, recompute_norm=False, recompute_norm_num_layers=None,
                recompute_activation_function=False, recompute_activation_function_num_layers=None,
                moe_grouped_gemm=False, multi_latent_attention=False, num_experts=None)
    return SimpleNamespace(**(base | given))


BAD = {
    "count_without_switch": (dict(recompute_norm_num_layers=2), "--recompute-norm-num-layers needs --recompute-norm"),
    "negative_count": (dict(recompute_activation_function=True, recompute_activation_function_num_layers=-1),
                       "must be between 0 and --num-layers (4), got -1"),
    "full_uniform": (dict(recompute_norm=True, recompute_granularity="full", recompute_method="uniform"),
                     "needs --recompute-method block"),
    "modules_without_selective": (dict(recompute_modules=["mlp"]), "needs --recompute-granularity selective"),
    "gdn_norm_out": (dict(recompute_granularity="selective", recompute_modules=["gdn_norm_out"]),
                     "gated-delta-net layers"),
    "moe_act_dense": (dict(recompute_granularity="selective", recompute_modules=["moe_act"]),
                      "moe_act needs --moe-grouped-gemm"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_recompute_input_is_one_line(case):
    given, message = BAD[case]
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        Recompute().validate(args(**given), None)
    assert "\n" not in str(err.value)


def test_good_recompute_input_passes():
    Recompute().validate(args(recompute_norm=True, recompute_norm_num_layers=4, recompute_granularity="full",
                              recompute_method="block", recompute_activation_function=True), None)
    Recompute().validate(args(recompute_activations=True, recompute_modules=["core_attn", "layernorm", "mlp"]), None)
    Recompute().validate(args(recompute_granularity="selective", recompute_modules=["gdn_norm_out"],
                              experimental_attention_variant="gated_delta_net"), None)


def test_fsdp2_yaml_recompute_modules_and_the_finer_recompute_are_one_or_the_other(tmp_path):
    """Both would recompute the same layer twice over (torch's checkpoint around the discarding one)."""
    from adaptor.fsdp2.config import Fsdp2ConfigError, load_config, resolve_config

    path = tmp_path / "fsdp2.yaml"
    path.write_text('recompute_modules: ["decoder.layers.{*}"]\n')
    margs = SimpleNamespace(bf16=False, fp16=False, torch_fsdp2_reshard_after_forward=True,
                            recompute_granularity=None, recompute_norm=True)
    with pytest.raises(Fsdp2ConfigError, match="recompute_modules recomputes whole modules; drop it or --recompute-norm"):
        resolve_config(load_config(str(path)), margs)
