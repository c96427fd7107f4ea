"""The Qwen2.5-VL / Qwen3-VL text decoder as megatron-core's ``GPTModel`` with 3-D rotary positions.

``position_embedding_type="mrope"`` makes ``GPTModel`` rotate by megatron-core's
``MultimodalRotaryEmbedding``, whose sectioned table is Qwen2.5-VL's. Qwen3-VL interleaves the axes
over the frequencies, which megatron-core does not build: its decoder gets
:class:`~adaptor.mm.qwen_vl.rotary.AxisTableRotaryEmbedding` in that module's place (same call, same
output layout), so nothing upstream is patched. The rest is megatron-core's dense GQA decoder: RMSNorm,
SwiGLU, q/k/v bias (Qwen2.5-VL) or q/k RMSNorm (Qwen3-VL), untied or tied output layer.
"""
from __future__ import annotations

import torch.nn.functional as F

from adaptor.mm.qwen_vl.rotary import AxisTableRotaryEmbedding
from adaptor.mm.qwen_vl.text_config import VlTextConfig


def decoder_transformer_config(text: VlTextConfig, **overrides):
    """megatron-core's ``TransformerConfig`` of the decoder; ``overrides`` are further fields (precision,
    parallel sizes, recompute, initialisation...)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = dict(
        num_layers=text.num_layers, hidden_size=text.hidden_size, ffn_hidden_size=text.ffn_hidden_size,
        num_attention_heads=text.num_heads, num_query_groups=text.num_query_groups, kv_channels=text.head_dim,
        normalization="RMSNorm", layernorm_epsilon=text.norm_epsilon, gated_linear_unit=True,
        activation_func=F.silu, bias_activation_fusion=False, add_bias_linear=False, add_qkv_bias=text.qkv_bias,
        qk_layernorm=text.qk_norm, hidden_dropout=0.0, attention_dropout=0.0, apply_rope_fusion=False,
        mrope_section=list(text.mrope_section),
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def build_decoder(text: VlTextConfig, config=None, layer_spec=None, *, vocab_size: int | None = None,
                  max_sequence_length: int = 32768, pre_process: bool = True, post_process: bool = True,
                  **gpt_kwargs):
    """A ``GPTModel`` for ``text``; ``config`` defaults to :func:`decoder_transformer_config`, ``layer_spec``
    to megatron-core's local spec (callers with arguments pass :func:`adaptor.layer_specs.gpt_layer_spec`)."""
    from megatron.core.models.gpt import GPTModel

    config = config or decoder_transformer_config(text)
    if layer_spec is None:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        layer_spec = get_gpt_layer_local_spec(qk_layernorm=text.qk_norm, normalization="RMSNorm")
    model = GPTModel(
        config, layer_spec, vocab_size=vocab_size or text.vocab_size, max_sequence_length=max_sequence_length,
        pre_process=pre_process, post_process=post_process, share_embeddings_and_output_weights=text.tied,
        position_embedding_type="mrope", rotary_base=text.rope_theta, **gpt_kwargs)
    if text.mrope_interleaved:
        model.rotary_pos_emb = AxisTableRotaryEmbedding(text.head_dim, text.rope_theta, text.mrope_section,
                                                        interleaved=True)
    return model
