"""DeepSeek-V3-style attention (MLA) without Transformer Engine: the layer spec and the core attention.

The layer spec picks MLADotProductAttention for ``--multi-latent-attention`` (FlashAttention under
``--use-flash-attn``); MLADotProductAttention, on a one-process gloo group, equals attention written
out in float64. Whole DeepSeek-V3 training runs (layouts, the MTP loss,
two-process collectives): tests/e2e/test_deepseek_v3.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest



def test_layer_spec_picks_mla_core_attention():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from adaptor.bootstrap import all_features
    from adaptor.layer_specs import module_swaps
    from adaptor.ops.flash_attention import FlashAttention
    from adaptor.ops.mla_attention import MLADotProductAttention

    features = list(all_features())
    mla = SimpleNamespace(multi_latent_attention=True)
    assert module_swaps(mla, features)[DotProductAttention] is MLADotProductAttention
    both = SimpleNamespace(multi_latent_attention=True, use_flash_attn=True)
    assert module_swaps(both, features)[DotProductAttention] is FlashAttention
    assert DotProductAttention not in module_swaps(SimpleNamespace(multi_latent_attention=False), features)


# MLADotProductAttention against attention written out in float64: softmax(q k^T * scale) v with
# query/key head dim 24 and value head dim 16, causal (no mask given) and with a padding mask.
# fp32 against float64 on O(1) values: errors near 1e-6; 1e-5 bounds them, while a wrong scale,
# mask or head split changes outputs by > 1e-1.


def test_mla_core_attention_matches_reference(model_parallel):
    """In this process set up as a one-rank training run (the model_parallel fixture)."""
    import torch
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    from adaptor.ops.mla_attention import MLADotProductAttention

    model_parallel_cuda_manual_seed(1234)
    S, B, H, DK, DV, SCALE = 12, 2, 4, 24, 16, 0.3
    config = MLATransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=H, multi_latent_attention=True,
                                  q_lora_rank=32, kv_lora_rank=24, qk_head_dim=16, qk_pos_emb_head_dim=8,
                                  v_head_dim=DV, masked_softmax_fusion=False, attention_dropout=0.0)
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(S, B, H, DK, generator=g, requires_grad=True) for _ in range(2))
    v = torch.randn(S, B, H, DV, generator=g, requires_grad=True)
    dout = torch.randn(S, B, H * DV, generator=g)
    padding = torch.rand(B, 1, S, S, generator=g) < 0.3
    padding[..., 0] = False  # every query keeps one key

    def reference(masked):
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        scores = torch.einsum("sbhd,tbhd->bhst", q64, k64) * SCALE
        scores = scores.masked_fill(masked, float("-inf"))
        out = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v64).reshape(S, B, H * DV)
        return [out] + list(torch.autograd.grad(out, (q64, k64, v64), dout.double()))

    facts = {}
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)
    for name, mask_type, mask, masked in (("causal", AttnMaskType.causal, None, causal),
                                          ("padding", AttnMaskType.padding, padding, padding)):
        module = MLADotProductAttention(config, layer_number=1, attn_mask_type=mask_type, attention_type="self",
                                        softmax_scale=SCALE, k_channels=DK, v_channels=DV)
        out = module(q, k, v, mask)
        ours = [out] + list(torch.autograd.grad(out, (q, k, v), dout))
        theirs = reference(masked)
        facts[name] = {"shape": list(out.shape),
                       "errors": [float((a.detach().double() - b.detach()).abs().max()) for a, b in zip(ours, theirs)]}
    default = MLADotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self",
                                     k_channels=DK, v_channels=DV)
    facts["default_scale"] = default.softmax_scale

    for name in ("causal", "padding"):
        assert facts[name]["shape"] == [12, 2, 4 * 16], facts
        assert max(facts[name]["errors"]) < 1e-5, facts  # output and dq, dk, dv
    assert facts["default_scale"] == pytest.approx(24 ** -0.5)  # the key head dim, not kv_channels
