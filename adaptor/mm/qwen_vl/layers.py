"""megatron-core building blocks of the vision towers: the block spec and config, the patch merger.

A vision block is megatron-core's ``TransformerLayer`` (pre-norm attention and MLP with residuals)
with column/row-parallel linears, so tensor parallelism splits heads and MLP columns as it does in the
decoder. Attention is the local ``DotProductAttention`` fed a block-diagonal mask: it runs on any
device and lets each image, or each window, attend only to itself inside one packed sequence. The
norm is torch's RMSNorm (Qwen2.5-VL) or LayerNorm (Qwen3-VL) through megatron's ``WrappedTorchNorm``.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from adaptor.mm.qwen_vl.settings import VisionSettings

ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}

# Switches every config here sets: exact (unfused) math and no dropout, so that the towers compute
# what the published models compute, on any device.
_PLAIN = dict(attention_dropout=0.0, hidden_dropout=0.0, add_bias_linear=True, bias_activation_fusion=False,
              masked_softmax_fusion=False, apply_rope_fusion=False, bias_dropout_fusion=False,
              persist_layer_norm=False, gradient_accumulation_fusion=False)


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def block_config(settings: VisionSettings, **overrides) -> TransformerConfig:
    """The vision blocks' TransformerConfig; ``overrides`` add run settings (dtype, TP size, ...)."""
    qwen25 = settings.family == "qwen2_5_vl"
    return TransformerConfig(
        num_layers=settings.depth, hidden_size=settings.hidden_size, ffn_hidden_size=settings.intermediate_size,
        num_attention_heads=settings.num_heads, num_query_groups=settings.num_heads, kv_channels=settings.head_dim,
        normalization="RMSNorm" if qwen25 else "LayerNorm", layernorm_epsilon=settings.norm_eps,
        gated_linear_unit=qwen25, activation_func=_activation(settings.hidden_act), add_qkv_bias=True,
        **{**_PLAIN, **overrides})


def merger_config(settings: VisionSettings, **overrides) -> TransformerConfig:
    """The merger MLP's config: ``merge_unit * hidden`` in and between, ``out_hidden_size`` out, exact GELU.

    It has no attention; its head count only has to divide over the tensor-parallel ranks.
    """
    heads = overrides.get("tensor_model_parallel_size", 1)
    return TransformerConfig(
        num_layers=1, hidden_size=settings.out_hidden_size, ffn_hidden_size=settings.merge_unit * settings.hidden_size,
        num_attention_heads=heads, kv_channels=1, gated_linear_unit=False, activation_func=F.gelu,
        **{**_PLAIN, **overrides})


def block_spec() -> ModuleSpec:
    """TransformerLayer spec of a vision block (norm type from the config)."""
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.padding},  # the mask argument decides who sees whom
                submodules=SelfAttentionSubmodules(linear_qkv=ColumnParallelLinear,
                                                   core_attention=DotProductAttention,
                                                   linear_proj=RowParallelLinear)),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=functools.partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(
                linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)),
            mlp_bda=get_bias_dropout_add,
        ),
    )


class PatchMerger(torch.nn.Module):
    """Joins each ``m x m`` block of patch features into one token: norm, concatenate, MLP (GELU).

    ``norm_after_join`` normalises the joined ``m*m*hidden`` vector (Qwen3-VL's deepstack mergers)
    instead of each patch's ``hidden`` vector before joining (the main mergers; Qwen2.5-VL's is
    MindSpeed-MM's ``lnmlp`` projector). The MLP is megatron-core's, column- then row-parallel.
    """

    def __init__(self, settings: VisionSettings, config: TransformerConfig, norm_after_join: bool = False):
        super().__init__()
        self.joined = settings.merge_unit * settings.hidden_size
        self.norm_after_join = norm_after_join
        width = self.joined if norm_after_join else settings.hidden_size
        if settings.family == "qwen2_5_vl":
            self.norm = torch.nn.RMSNorm(width, eps=settings.norm_eps, dtype=config.params_dtype)
        else:
            self.norm = torch.nn.LayerNorm(width, eps=settings.norm_eps, dtype=config.params_dtype)
        self.mlp = MLP(config, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
                       input_size=self.joined)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[patches, hidden] -> [patches / (m*m), out_hidden]."""
        if self.norm_after_join:
            joined = self.norm(patches.reshape(-1, self.joined))
        else:
            joined = self.norm(patches).reshape(-1, self.joined)
        out, bias = self.mlp(joined)
        return out if bias is None else out + bias
