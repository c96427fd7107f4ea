"""``--cross-entropy-loss-fusion``: chunked vocabulary-parallel cross entropy on every backend.

Upstream: ``LanguageModule.compute_language_model_loss`` calls
``megatron.core.fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy`` (``--cross-entropy-fusion-impl
native``), which keeps an fp32 softmax of the whole logits shard (the step's biggest buffers) and
always returns a bf16 gradient. The name in ``language_module`` is rebound to
``adaptor.ops.cross_entropy``'s chunked version (gradient in the logits' dtype; equal to
``vocab_parallel_cross_entropy`` to fp32 round-off). ``te`` needs Transformer Engine and Megatron
0.19.2 rejects it anyway: one line pointing to ``native``.

Remove when: upstream's ``fused_vocab_parallel_cross_entropy`` returns the gradient in the logits'
dtype (it casts to bf16, fused_cross_entropy.py line 82) and no longer keeps an fp32 softmax of the
whole logits shard for backward; the memory saving is the main reason for this feature, so the dtype
fix alone does not retire it. Neither is done in megatron-core 0.19.2 nor on Megatron-LM main
(d98e8a64, 2026-08-22); no upstream issue or PR found.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature

OWNER = __name__
TARGET = "megatron.core.fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy"


class CrossEntropyFusion(Feature):
    name = "cross_entropy"
    upstream_flags = ("--cross-entropy-loss-fusion",)

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "cross_entropy_loss_fusion", False))

    def register_patches(self, pm, ctx) -> None:
        from adaptor.ops.cross_entropy import fused_vocab_parallel_cross_entropy

        pm.register_replacement(TARGET, fused_vocab_parallel_cross_entropy, OWNER)

    def validate(self, args, ctx) -> None:
        if getattr(args, "cross_entropy_loss_fusion", False) and args.cross_entropy_fusion_impl == "te":
            raise ArgumentError(
                "--cross-entropy-fusion-impl te needs Transformer Engine and megatron-core 0.19.2 "
                "rejects it; use --cross-entropy-fusion-impl native (the adaptor's chunked fused "
                "cross entropy, on every backend)"
            )
