"""Layer specs for GPTModel, chosen per backend in one place.

megatron-core describes a layer as data (``ModuleSpec``); we only decide
which upstream builder produces it:

* ``--transformer-impl transformer_engine`` (CUDA with Transformer Engine
  installed): megatron-core's TE spec, unchanged.
* otherwise (NPU, CPU, or CUDA without TE): megatron-core's local spec, built
  from plain torch modules. The backend defaults pick ``local`` by themselves
  when TE cannot run, so users pass the same flags everywhere.
"""
from __future__ import annotations

from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.transformer_config import TransformerConfig


def gpt_layer_spec(args, config: TransformerConfig, vp_stage=None):
    """Spec for one decoder layer, or a block spec when MoE layers vary per layer."""
    use_te = args.transformer_impl == "transformer_engine"
    if args.num_experts:
        return get_gpt_decoder_block_spec(
            config, use_transformer_engine=use_te, normalization=args.normalization, vp_stage=vp_stage
        )
    if use_te:
        return get_gpt_layer_with_transformer_engine_spec(
            args.num_experts, args.moe_grouped_gemm, args.qk_layernorm,
            args.multi_latent_attention,
        )
    return get_gpt_layer_local_spec(
        args.num_experts, args.moe_grouped_gemm, args.qk_layernorm,
        args.multi_latent_attention, normalization=args.normalization,
    )
