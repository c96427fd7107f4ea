"""``--use-flash-attn`` (Megatron's own flag) without Transformer Engine: fused core attention.

megatron-core 0.19.2 reads ``--use-flash-attn`` nowhere; its local spec's core attention,
``megatron.core.transformer.dot_product_attention.DotProductAttention``, builds the full
[b, heads, s, s] score matrix and repeats K/V for GQA. With the flag, the layer spec swaps it
(this feature's ``module_swaps`` row) for
``adaptor.ops.flash_attention.FlashAttention``: torch_npu's ``npu_fusion_attention`` on NPU,
``scaled_dot_product_attention`` on CUDA and CPU. Beside the swap, this feature only checks the configuration.

With ``--transformer-impl transformer_engine`` nothing is swapped: TE's own attention runs and
picks its fused backend itself, which is what the flag means to Megatron there.
"""
from __future__ import annotations

from adaptor.command_line.attention_backend import flash_attention_refusal
from adaptor.features import ArgumentError, Feature


class FlashAttentionFusion(Feature):
    name = "flash_attention"
    upstream_flags = ("--use-flash-attn",)
    # After the MLA feature in the registry, so MLA with --use-flash-attn gets this class.
    module_swaps = (
        ("use_flash_attn", "megatron.core.transformer.dot_product_attention:DotProductAttention",
         "adaptor.ops.flash_attention:FlashAttention"),
    )

    def enabled(self, ctx) -> bool:
        return bool(getattr(ctx.flags, "use_flash_attn", False))

    def validate(self, args, ctx) -> None:
        if not getattr(args, "use_flash_attn", False) or args.transformer_impl == "transformer_engine":
            return
        why = flash_attention_refusal(getattr(args, "softmax_type", None), getattr(args, "window_size", None))
        if why:
            raise ArgumentError(f"--use-flash-attn (without Transformer Engine) {why}; drop one of them")
