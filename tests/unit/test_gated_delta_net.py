"""Gated DeltaNet without fla: the torch kernels against their closed forms, and a tiny GDN block built
through our layer spec, forward and backward (real megatron-core, in one gloo process).

* ``chunk_gated_delta_rule`` (megatron-core's chunked torch rule behind fla's signature) equals a
  step-by-step recurrence written from the definition, ``S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T)
  + beta_t v_t k_t^T``, ``o_t = S_t (scale q_t)``, with fla's conventions (``g`` the log decay, queries
  scaled by ``K ** -0.5`` unless ``scale`` says otherwise, q/k L2-normalised by the caller or with
  ``use_qk_l2norm_in_kernel``), in outputs, final states and every input's gradient; packed sequences
  (``cu_seqlens``) equal the sequences run one by one.
* ``causal_conv1d`` equals ``F.conv1d`` over the left-zero-padded input, then SiLU.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("ADAPTOR_BACKEND", "cpu")

from adaptor.ops.gated_delta_rule import causal_conv1d, chunk_gated_delta_rule, l2norm  # noqa: E402


def recurrent_rule(q, k, v, g, beta, scale=None, initial_state=None):
    """The gated delta rule one step at a time, from its definition (state as a [V, K] matrix)."""
    batch, steps, heads, dk = q.shape
    scale = dk ** -0.5 if scale is None else scale
    state = (torch.zeros(batch, heads, v.shape[-1], dk, dtype=q.dtype) if initial_state is None
             else initial_state.transpose(-1, -2).to(q.dtype))
    eye = torch.eye(dk, dtype=q.dtype)
    outs = []
    for t in range(steps):
        k_t, v_t, b_t = k[:, t], v[:, t], beta[:, t, :, None, None]
        decay = g[:, t].exp()[..., None, None]
        state = decay * state @ (eye - b_t * k_t[..., :, None] * k_t[..., None, :]) + b_t * v_t[..., :, None] * k_t[..., None, :]
        outs.append((state @ (scale * q[:, t])[..., None])[..., 0])
    return torch.stack(outs, dim=1), state.transpose(-1, -2)


def inputs(batch=2, steps=100, heads=3, dk=8, dv=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(batch, steps, heads, dk, generator=gen))
    k = l2norm(torch.randn(batch, steps, heads, dk, generator=gen))
    v = torch.randn(batch, steps, heads, dv, generator=gen)
    g = -F.softplus(torch.randn(batch, steps, heads, generator=gen))  # log of a decay in (0, 1)
    beta = torch.rand(batch, steps, heads, generator=gen)
    return [t.requires_grad_() for t in (q, k, v, g, beta)]


def grads(out, tensors, seed=1):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out * weight).sum(), tensors)


@pytest.mark.parametrize("steps", [1, 64, 100])  # one step, one full chunk, a padded second chunk
def test_chunked_rule_equals_the_recurrence_forward_and_backward(steps):
    tensors = inputs(steps=steps)
    state0 = torch.randn(2, 3, 8, 6, generator=torch.Generator().manual_seed(3))
    out, final = chunk_gated_delta_rule(*tensors, initial_state=state0, output_final_state=True)
    ref, ref_final = recurrent_rule(*tensors, initial_state=state0)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final, ref_final, rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(grads(out, tensors), grads(ref, tensors)):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_scale_and_l2norm_in_kernel_follow_fla():
    q, k, v, g, beta = inputs(steps=20)
    raw_q, raw_k = q * 3.0, k * 0.5  # no longer unit length: the kernel normalises them
    out, none = chunk_gated_delta_rule(raw_q, raw_k, v, g, beta, scale=0.3, use_qk_l2norm_in_kernel=True)
    ref, _ = recurrent_rule(l2norm(raw_q), l2norm(raw_k), v, g, beta, scale=0.3)
    assert none is None
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_packed_sequences_restart_the_state():
    q, k, v, g, beta = inputs(batch=1, steps=90)
    cu = torch.tensor([0, 30, 90])
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    for n, (a, b) in enumerate([(0, 30), (30, 90)]):
        ref, ref_final = recurrent_rule(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b])
        torch.testing.assert_close(out[:, a:b], ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(final[n:n + 1], ref_final, rtol=1e-4, atol=1e-5)


def test_l2norm_is_flas_formula():
    x = torch.randn(4, 5, 8)
    torch.testing.assert_close(l2norm(x), x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6))
    assert l2norm(x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("activation", ["silu", None])
def test_causal_conv1d_is_left_padded_conv_then_activation(activation):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 11, 6, generator=gen, requires_grad=True)
    weight = torch.randn(6, 4, generator=gen, requires_grad=True)
    bias = torch.randn(6, generator=gen, requires_grad=True)
    y, final = causal_conv1d(x=x, weight=weight, bias=bias, activation=activation, output_final_state=True)
    ref = F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), weight.unsqueeze(1), bias, groups=6).transpose(1, 2)
    ref = F.silu(ref) if activation else ref
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(final, x.transpose(1, 2)[..., -4:])
    for ours, theirs in zip(grads(y, (x, weight, bias)), grads(ref, (x, weight, bias))):
        torch.testing.assert_close(ours, theirs)
    # Packed: each sequence padded on its own; its first step sees no step of the one before.
    cu = torch.tensor([0, 5, 11])
    packed, _ = causal_conv1d(x=x[:1], weight=weight, bias=bias, activation=activation, cu_seqlens=cu)
    alone = [causal_conv1d(x=x[:1, a:b], weight=weight, bias=bias, activation=activation)[0] for a, b in [(0, 5), (5, 11)]]
    torch.testing.assert_close(packed, torch.cat(alone, dim=1))


def gdn_block(dtype=torch.float32, num_experts=None, **extra):
    """A 3-layer Qwen3-Next-like block through adaptor.layer_specs: GDN, GDN, then gated attention."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    from adaptor.layer_specs import gpt_layer_spec

    moe = dict(num_moe_experts=num_experts, moe_router_topk=2, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=32,
               moe_shared_expert_gate=True, moe_token_dispatcher_type="alltoall", moe_aux_loss_coeff=0.01) if num_experts else {}
    config = TransformerConfig(
        num_layers=3, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=8,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        attention_dropout=0.0, hidden_dropout=0.0, bias_activation_fusion=False, attention_output_gate=True,
        experimental_attention_variant="gated_delta_net", linear_attention_freq=3,
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, params_dtype=dtype, bf16=dtype == torch.bfloat16, **moe, **extra)
    args = SimpleNamespace(transformer_impl="local", experimental_attention_variant="gated_delta_net",
                           num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=False,
                           multi_latent_attention=False, normalization="RMSNorm", mtp_num_layers=None)
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    return TransformerBlock(config, gpt_layer_spec(args, config))


@pytest.mark.parametrize("dtype,num_experts", [(torch.float32, None), (torch.bfloat16, 4)])
def test_gdn_block_trains_through_our_spec(model_parallel, dtype, num_experts):
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet
    from megatron.core.transformer.attention import SelfAttention

    block = gdn_block(dtype, num_experts)
    kinds = [type(layer.self_attention) for layer in block.layers]
    assert kinds == [GatedDeltaNet, GatedDeltaNet, SelfAttention]
    gdn = block.layers[0].self_attention
    assert type(gdn.in_proj).__name__ == "ColumnParallelLinear"  # the input norm stays the layer's own
    assert type(block.layers[0].input_layernorm).__name__ != "IdentityOp"
    x = torch.randn(70, 2, 32, dtype=dtype, requires_grad=True)  # 70 steps: two chunks, the second padded
    out = block(x, attention_mask=None)
    out = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(out).all()
    out.float().square().mean().backward()
    assert torch.isfinite(x.grad).all()
    for name, param in block.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name


def test_gdn_norm_out_recompute_keeps_the_gradients(model_parallel):
    """``--recompute-modules gdn_norm_out``: the gated output norm is recomputed in backward
    (megatron-core's CheckpointWithoutOutput, which patches/memory/recompute makes work without TE)."""
    x = torch.randn(70, 2, 32)
    results = []
    for extra in ({}, dict(recompute_granularity="selective", recompute_modules=["gdn_norm_out"])):
        block = gdn_block(**extra)
        assert block.layers[0].self_attention.recompute_norm_out == bool(extra)
        inp = x.clone().requires_grad_()
        out = block(inp, attention_mask=None)
        (out[0] if isinstance(out, tuple) else out).square().mean().backward()
        results.append([inp.grad] + [p.grad for p in block.parameters()])
    for plain, recomputed in zip(*results):
        torch.testing.assert_close(recomputed, plain, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("given,message", [
    (dict(experimental_attention_variant="dsa"), "--experimental-attention-variant dsa: DeepSeek sparse attention"),
    (dict(experimental_attention_variant="gated_delta_net", reset_attention_mask=True),
     "--reset-attention-mask with --experimental-attention-variant gated_delta_net"),
    (dict(experimental_attention_variant="gated_delta_net", reset_attention_mask=True, use_flash_attn=True,
          deterministic_mode=True), "packed sequences with --experimental-attention-variant gated_delta_net"),
])
def test_what_the_local_gdn_cannot_give_is_one_line(given, message):
    from adaptor.errors import ArgumentError
    from patches.models.gated_delta_net import GatedDeltaNetWithoutFla

    args = SimpleNamespace(**({"reset_attention_mask": False, "context_parallel_size": 1} | given))
    with pytest.raises(ArgumentError, match=message) as err:
        GatedDeltaNetWithoutFla().validate(args, None)
    assert "\n" not in str(err.value)
    for packed in (False, True):  # no boundaries, or boundaries as THD (cu_seqlens, which GDN reads)
        GatedDeltaNetWithoutFla().validate(SimpleNamespace(
            experimental_attention_variant="gated_delta_net", reset_attention_mask=packed, use_flash_attn=packed,
            context_parallel_size=1), None)
