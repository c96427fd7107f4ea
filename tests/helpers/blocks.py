"""A small real megatron-core TransformerBlock on the local spec, for in-process tests of what the
memory features change (they need the ``model_parallel`` fixture's groups)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

S, B, H, FFN = 16, 2, 32, 64


def build(num_experts=None, mindspeed=(), grouped=True, **recompute):
    """A two-layer Qwen3-like block (RMSNorm, qk-layernorm, SwiGLU), weights from seed 1234; with
    ``num_experts``, MoE layers whose experts are the adaptor's GroupedExperts (``--moe-grouped-gemm``)
    or, with ``grouped=False``, megatron-core's SequentialMLP."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    from adaptor.layer_specs import swap_modules
    from adaptor.ops.grouped_matmul import GroupedExperts
    from megatron.core.transformer.moe.experts import SequentialMLP

    moe = dict(num_moe_experts=num_experts, moe_router_topk=1, moe_router_pre_softmax=True, moe_ffn_hidden_size=FFN, moe_grouped_gemm=grouped,
               moe_token_dispatcher_type="alltoall", moe_aux_loss_coeff=0.0) if num_experts else {}
    config = TransformerConfig(
        num_layers=2, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=4, num_query_groups=2,
        kv_channels=8, qk_layernorm=True, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0, bias_activation_fusion=False,
        **moe, **recompute)
    for switch in ("recompute_norm", "recompute_activation_function"):
        setattr(config, switch, switch in mindspeed)
        setattr(config, switch + "_num_layers", None)
    spec = get_gpt_layer_local_spec(num_experts, bool(num_experts), qk_layernorm=True, normalization="RMSNorm")
    if grouped:
        spec = swap_modules(spec, {SequentialMLP: GroupedExperts})
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    return TransformerBlock(config, spec)
