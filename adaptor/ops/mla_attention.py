"""Unfused core attention for multi-latent attention (MLA) on the local spec.

megatron-core 0.19.2's ``MultiLatentAttention`` builds its core attention with
``k_channels`` (query/key head dim, ``qk_head_dim + qk_pos_emb_head_dim``) and ``v_channels``
(``v_head_dim``), which ``DotProductAttention`` does not accept: the local spec cannot build MLA.
:class:`MLADotProductAttention` is DotProductAttention with those two arguments: the same
scores, mask, softmax and dropout code (its ``forward`` is inherited unchanged; it already
reads head dims from the tensors), with the output width taken from the value head dim.
``--use-flash-attn`` selects ``adaptor.ops.flash_attention.FlashAttention`` instead, which takes
the same arguments.
"""
from __future__ import annotations

import math
from typing import Optional

from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig


class MLADotProductAttention(DotProductAttention):
    """DotProductAttention whose query/key head dim (k_channels) may differ from the value's (v_channels)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Optional[ProcessGroupCollection] = None,
        k_channels: Optional[int] = None,
        v_channels: Optional[int] = None,
    ):
        k_channels = k_channels or config.kv_channels
        v_channels = v_channels or config.kv_channels
        if softmax_scale is None:  # upstream's default would use kv_channels, not the key head dim
            softmax_scale = 1.0 / math.sqrt(k_channels)
        super().__init__(config, layer_number, attn_mask_type, attention_type, attention_dropout,
                         softmax_scale, cp_comm_type, pg_collection)
        self.hidden_size_per_attention_head = k_channels
        self.hidden_size_per_attention_head_v = v_channels
        # DotProductAttention.forward reshapes its output [sq, b, np, v_dim] to this width.
        self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition
