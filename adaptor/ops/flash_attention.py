"""Core attention (``--use-flash-attn``) for the local spec: a drop-in for DotProductAttention.

DotProductAttention materializes the [b, heads, sq, sk] scores (and repeats K/V for GQA);
FlashAttention calls one fused kernel instead:

* NPU: ``torch_npu.npu_fusion_attention``: layout SBH for Megatron's [s, b, heads, dim] (a view),
  BSND for batch-major input, TND for packed sequences; causal via ``sparse_mode=2`` with the
  2048x2048 compressed mask, other masks as ``atten_mask`` (True = masked) with ``inner_precise=2``;
  dropout via ``keep_prob``; GQA with fewer K/V heads.
* CUDA and CPU: ``torch.nn.functional.scaled_dot_product_attention`` (``is_causal`` where possible,
  ``enable_gqa``).

Semantics follow DotProductAttention (mask, scale, dropout under the TP RNG tracker), except that a
fully masked query row gives 0 instead of the mean of V; such rows are padding without loss. MLA
passes ``k_channels``/``v_channels``. With ``--context-parallel-size`` > 1 each layer runs
``adaptor.ops.context_parallel`` by its ``cp_comm_type``.
"""
from __future__ import annotations

import math
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from megatron.core import tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

from adaptor import run_state
from adaptor.ops.npu_attention_mask import (
    MAX_TOKENS,
    NPU_INVALID_ROW_CORRECTION,
    NPU_SPARSE_CAUSAL,
    NPU_SPARSE_DEFAULT,
    NPU_SPARSE_VARLEN_CAUSAL,
    npu_causal_mask,
)

_mask_cache: list = [None, None, None, None]  # weakref to the last mask seen, its _version, causal?, ~mask


def _mask_facts(mask: Tensor) -> tuple[bool, Optional[Tensor]]:
    """(whether a Megatron mask — True = masked — is exactly causal, its inverse for SDPA).

    Every layer gets the same mask tensor, so both are computed once per micro-batch.
    """
    ref, version, causal, attend = _mask_cache
    if ref is not None and ref() is mask and version == mask._version:
        return causal, attend
    sq, sk = mask.shape[-2], mask.shape[-1]
    causal = bool(
        mask.dtype == torch.bool and sq == sk
        and torch.equal(mask, torch.ones(sq, sk, dtype=torch.bool, device=mask.device).triu(1).expand_as(mask))
    )
    attend = None if causal else ~mask
    _mask_cache[:] = [weakref.ref(mask), mask._version, causal, attend]
    return causal, attend


def is_causal_mask(mask: Tensor) -> bool:
    return _mask_facts(mask)[0]


def context_parallel_groups(cp_comm_type: str, pg_collection: Optional[ProcessGroupCollection]):
    """The Ulysses and ring groups of one layer's ``--cp-comm-type``."""
    from megatron.core import parallel_state

    from adaptor.ops.context_parallel import CP_COMM_TYPES, CPGroups

    cp_group = getattr(pg_collection, "cp", None) if pg_collection is not None else None
    cp_group = cp_group or parallel_state.get_context_parallel_group()
    size = cp_group.size()
    if cp_comm_type == "p2p":
        return CPGroups(size, ring=cp_group)
    if cp_comm_type == "a2a":
        return CPGroups(size, ulysses=cp_group)
    if cp_comm_type == "a2a+p2p":
        inner, outer = parallel_state.get_hierarchical_context_parallel_groups()[:2]
        return CPGroups(size, ulysses=inner, ring=outer)
    raise ValueError(f"--cp-comm-type {cp_comm_type} is not available without Transformer Engine; "
                     f"use one of {', '.join(CP_COMM_TYPES)}")


_lengths_cache: list = [None, None]  # weakref to the last cu_seqlens seen, its lengths


def _padded_lengths(packed: PackedSeqParams) -> tuple:
    """Host list of the packed sequences' (padded) lengths; every layer asks, one copy per micro-batch."""
    cu = packed.cu_seqlens_q_padded if packed.cu_seqlens_q_padded is not None else packed.cu_seqlens_q
    ref, lengths = _lengths_cache
    if ref is not None and ref() is cu:
        return lengths
    host = cu.tolist()
    lengths = tuple(b - a for a, b in zip(host[:-1], host[1:]) if b > a)
    _lengths_cache[:] = [weakref.ref(cu), lengths]
    return lengths


class FlashAttention(MegatronModule):
    """Fused core attention with DotProductAttention's constructor and forward signatures."""

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
        super().__init__(config=config)
        if config.softmax_type != "vanilla":
            raise ValueError(f"--use-flash-attn supports --softmax-type vanilla only, not {config.softmax_type}")
        if config.window_size is not None:
            raise ValueError("--use-flash-attn does not support --window-size (sliding-window attention)")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.pg_collection = pg_collection
        self.tp_group = pg_collection.tp
        world_size = pg_collection.tp.size()

        k_channels = k_channels or config.kv_channels
        v_channels = v_channels or config.kv_channels
        self.hidden_size_per_attention_head = k_channels
        self.hidden_size_per_attention_head_v = v_channels  # MLA resizes this for padded THD values
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, world_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, world_size)
        self.softmax_scale = 1.0 / math.sqrt(k_channels) if softmax_scale is None else softmax_scale
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.backend = run_state.backend().name
        self.cp_groups = None
        if config.context_parallel_size > 1:
            self.cp_groups = context_parallel_groups(cp_comm_type or "p2p", pg_collection)

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Optional[Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> Tensor:
        """[s, b, heads, d] query/key/value -> [s, b, heads * d_v] (THD: [t, n, d] -> [t, n * d_v])."""
        if attention_bias is not None:
            raise NotImplementedError("FlashAttention takes no attention_bias (neither does DotProductAttention)")
        dropout = self.dropout_p if self.training else 0.0
        causal = self.attn_mask_type == AttnMaskType.causal
        if attention_mask is not None and causal and is_causal_mask(attention_mask):
            attention_mask = None  # the same mask, run as the kernel's causal mode
        if causal and attention_mask is None and query.size(0) == 1:
            causal = False  # one query (decode): DotProductAttention applies no mask either
        packed = packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
        if causal and attention_mask is None and not packed and query.size(0) != key.size(0):
            raise ValueError("causal mask is only for self attention (as in DotProductAttention)")
        if self.cp_groups is not None:
            return self._context_parallel(query, key, value, attention_mask, causal, dropout,
                                          packed_seq_params if packed else None)
        fn = self._npu if self.backend == "npu" else self._sdpa
        if dropout > 0.0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return fn(query, key, value, attention_mask, causal, dropout, packed_seq_params if packed else None)
        return fn(query, key, value, attention_mask, causal, dropout, packed_seq_params if packed else None)

    # ------------------------------------------------------ context parallel
    def _context_parallel(self, q, k, v, mask, causal, dropout, packed):
        from adaptor.ops import context_parallel

        if mask is not None:
            raise ValueError("context parallelism runs causal or packed-document attention, not an explicit mask")
        if dropout > 0.0:
            raise ValueError("context parallelism runs attention without dropout (--attention-dropout 0)")
        if packed is not None:  # [t, n, d]: one stream of documents, each split over the CP ranks
            lengths = _padded_lengths(packed)
            out = context_parallel.attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), self.cp_groups,
                                             causal=causal, scale=self.softmax_scale, seq_lengths=lengths)
            return out[0].transpose(0, 1).reshape(q.size(0), -1)
        s, b = q.size(0), q.size(1)
        out = context_parallel.attention(*(x.permute(1, 2, 0, 3) for x in (q, k, v)), self.cp_groups,
                                         causal=causal, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    # ---------------------------------------------------------- CUDA and CPU
    def _sdpa(self, q, k, v, mask, causal, dropout, packed):
        if packed is not None:
            return self._sdpa_packed(q, k, v, causal, dropout, packed)
        s, b = q.size(0), q.size(1)
        attend = None
        if mask is not None:
            mask_is_causal, attend = _mask_facts(mask)
            causal = mask_is_causal  # a mask given decides, whatever the layer's mask type
        out = self._sdpa_bhsd(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3),
                              attend, causal, dropout)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)  # [b, n, s, dv] -> [s, b, n * dv]

    def _sdpa_bhsd(self, q, k, v, attend, is_causal, dropout):
        gqa = q.size(1) != k.size(1)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attend, dropout_p=dropout, is_causal=is_causal,
            scale=self.softmax_scale, enable_gqa=gqa,
        )

    def _sdpa_packed(self, q, k, v, causal, dropout, packed):
        """THD: [t, n, d]; each packed sequence attends only within itself."""
        cu_q = (packed.cu_seqlens_q_padded if packed.cu_seqlens_q_padded is not None else packed.cu_seqlens_q)
        cu_kv = (packed.cu_seqlens_kv_padded if packed.cu_seqlens_kv_padded is not None else packed.cu_seqlens_kv)
        outs = []
        for q0, q1, k0, k1 in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_kv[:-1].tolist(), cu_kv[1:].tolist()):
            o = self._sdpa_bhsd(q[q0:q1].transpose(0, 1)[None], k[k0:k1].transpose(0, 1)[None],
                                v[k0:k1].transpose(0, 1)[None], None, causal and q1 - q0 > 1, dropout)
            outs.append(o[0].transpose(0, 1))
        return torch.cat(outs).reshape(q.size(0), -1)

    # ------------------------------------------------------------------- NPU
    def _npu(self, q, k, v, mask, causal, dropout, packed):
        import torch_npu

        n = q.size(-2)
        dq, dv = q.size(-1), v.size(-1)
        if dv != dq:  # the kernel wants one head dim for K and V: pad V, trim the output
            v = F.pad(v, (0, dq - dv)) if dv < dq else v
            if dv > dq:
                raise NotImplementedError("value head dim larger than query/key head dim on NPU")
        kwargs = dict(scale=self.softmax_scale, keep_prob=1.0 - dropout)
        if packed is not None:
            cu_q = packed.cu_seqlens_q_padded if packed.cu_seqlens_q_padded is not None else packed.cu_seqlens_q
            cu_kv = packed.cu_seqlens_kv_padded if packed.cu_seqlens_kv_padded is not None else packed.cu_seqlens_kv
            if causal:
                kwargs.update(atten_mask=npu_causal_mask(q.device), sparse_mode=NPU_SPARSE_VARLEN_CAUSAL)
            out = torch_npu.npu_fusion_attention(
                q, k, v, n, "TND", actual_seq_qlen=cu_q[1:].tolist(), actual_seq_kvlen=cu_kv[1:].tolist(),
                **kwargs,
            )[0]
            return out[..., :dv].reshape(q.size(0), -1)
        if mask is not None:
            # A row with every key masked (padding) is only defined, as 0, with inner_precise=2
            # ("invalid row" correction); causal modes never have such rows here.
            kwargs.update(atten_mask=mask, sparse_mode=NPU_SPARSE_DEFAULT, inner_precise=NPU_INVALID_ROW_CORRECTION)
        elif causal:
            kwargs.update(atten_mask=npu_causal_mask(q.device), sparse_mode=NPU_SPARSE_CAUSAL,
                          pre_tockens=MAX_TOKENS, next_tockens=0)
        s, b = q.size(0), q.size(1)
        if q.transpose(0, 1).is_contiguous() and not q.is_contiguous():  # batch-major storage
            out = torch_npu.npu_fusion_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), n, "BSND", **kwargs)[0]
            out = out.transpose(0, 1)  # [b, s, n, d] -> [s, b, n, d]
        else:
            out = torch_npu.npu_fusion_attention(
                q.reshape(s, b, -1), k.reshape(k.size(0), b, -1), v.reshape(v.size(0), b, -1), n, "SBH",
                **kwargs)[0]
            out = out.view(s, b, n, dq)
        if dv != dq:
            out = out[..., :dv]
        return out.reshape(s, b, -1)
