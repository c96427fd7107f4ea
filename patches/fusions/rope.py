"""``--use-fused-rotary-pos-emb``: RoPE in one kernel without Transformer Engine.

Upstream: ``megatron.core.models.common.embeddings.rope_utils.
apply_rotary_pos_emb`` calls ``fused_apply_rotary_pos_emb`` (bshd) /
``fused_apply_rotary_pos_emb_thd`` (packed sequences) when
``config.apply_rope_fusion``; both come from TE and are None without it, and
``TransformerConfig.__post_init__`` then refuses ``apply_rope_fusion``
("Please install TE >= 1.4"). This flag turns ``--apply-rope-fusion`` on
(unless given explicitly) and, where TE did not provide them, sets both
module attributes to ``adaptor.ops.rope``'s: ``torch_npu.npu_rotary_mul`` on
NPU, an autograd Function on CUDA/CPU (megatron-core's rotate_half layout,
``--rotary-percent`` < 1 included). Upstream still takes its unfused path for
mscale != 1, MLA-style interleaving and mRoPE with batch > 1.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature
from adaptor.log import notice_once

OWNER = __name__
TARGET = "megatron.core.models.common.embeddings.rope_utils"


class RopeFusion(Feature):
    name = "rope"

    def add_arguments(self, group) -> None:
        group.add_argument("--use-fused-rotary-pos-emb", action="store_true", dest="use_fused_rotary_pos_emb",
                           help="RoPE in one kernel: torch_npu.npu_rotary_mul on NPU, a fused autograd "
                                "function on CUDA/CPU (turns on rope fusion without Transformer Engine).")

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "use_fused_rotary_pos_emb", False))

    def register_patches(self, pm, ctx) -> None:
        import importlib

        from adaptor.ops import rope

        rope_utils = importlib.import_module(TARGET)
        for name in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
            if getattr(rope_utils, name) is None:  # TE's kernels, where present, stay
                pm.register_replacement(f"{TARGET}.{name}", getattr(rope, name), OWNER)

    def set_defaults(self, args, ctx) -> None:
        if getattr(args, "multi_latent_attention", False):
            # MLA's fused RoPE is megatron-core's Triton kernel (CUDA only): MLA keeps its unfused RoPE.
            notice_once("--use-fused-rotary-pos-emb is not applied to multi-latent attention: "
                        "its fused RoPE is a Triton/CUDA kernel; MLA's RoPE runs unfused")
            return
        if "apply_rope_fusion" not in ctx.explicit:
            args.apply_rope_fusion = True

    def validate(self, args, ctx) -> None:
        if args.position_embedding_type != "rope" and not args.use_rotary_position_embeddings:
            raise ArgumentError("--use-fused-rotary-pos-emb needs --position-embedding-type rope")
        if args.multi_latent_attention:
            return  # not applied to MLA (said in set_defaults)
        if not args.apply_rope_fusion:
            raise ArgumentError("--use-fused-rotary-pos-emb and --no-rope-fusion contradict each other; drop one")
        if args.rotary_interleaved:
            raise ArgumentError("--use-fused-rotary-pos-emb supports the non-interleaved RoPE layout only; "
                                "drop --rotary-interleaved or the fused flag")
