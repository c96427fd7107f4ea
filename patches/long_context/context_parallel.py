"""``--context-parallel-size N`` without Transformer Engine: ring, Ulysses and hybrid attention.

megatron-core 0.19.2 runs context parallelism only in TE's attention; its local
``megatron.core.transformer.dot_product_attention.DotProductAttention`` asserts CP = 1, though the
rest (batch split, RoPE, loss, gradient reduction) handles CP. The ``module_swaps`` row puts
``adaptor.ops.flash_attention.FlashAttention`` there, running ``adaptor.ops.context_parallel`` by
``--cp-comm-type``: ``p2p`` ring (MindSpeed's ``megatron_cp_algo``), ``a2a`` Ulysses
(``ulysses_cp_algo``), or ``a2a+p2p`` with ``--hierarchical-context-parallel-sizes U R``
(``hybrid_cp_algo`` with ``--ulysses-degree-in-cp U``).

The layout is checked before any process group exists, and the dataloader's dense [s, s] mask is
turned off (``--no-create-attention-mask-in-dataloader``): CP attention never reads it, and at long
lengths it alone is gigabytes.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature
from adaptor.log import notice_once

def _comm_types(args) -> list[str]:
    value = args.cp_comm_type
    return [value] if isinstance(value, str) else list(value or ["p2p"])


class ContextParallel(Feature):
    name = "context_parallel"
    module_swaps = (
        ("context_parallel_size>1", "megatron.core.transformer.dot_product_attention:DotProductAttention",
         "adaptor.ops.flash_attention:FlashAttention"),
    )

    def set_defaults(self, args, ctx) -> None:
        if (args.context_parallel_size or 1) > 1 and args.transformer_impl != "transformer_engine":
            if args.create_attention_mask_in_dataloader:
                notice_once("context parallelism: the dataloader builds no [s, s] attention mask "
                            "(--no-create-attention-mask-in-dataloader); attention is causal or per document")
            args.create_attention_mask_in_dataloader = False

    def validate(self, args, ctx) -> None:
        from adaptor.ops.context_parallel import CP_COMM_TYPES

        cp = args.context_parallel_size or 1
        if cp == 1 or args.transformer_impl == "transformer_engine":
            if args.hierarchical_context_parallel_sizes and cp == 1:
                raise ArgumentError("--hierarchical-context-parallel-sizes needs --context-parallel-size > 1")
            return
        types = _comm_types(args)
        for t in types:
            if t not in CP_COMM_TYPES:
                raise ArgumentError(f"--cp-comm-type {t} is not available without Transformer Engine; "
                                    f"use one of {', '.join(CP_COMM_TYPES)}")
        if len(types) not in (1, args.num_layers):
            raise ArgumentError(f"--cp-comm-type takes one value or one per layer ({args.num_layers}); "
                                f"got {len(types)}")
        if args.seq_length is not None and args.seq_length % (2 * cp):
            raise ArgumentError(f"--seq-length {args.seq_length} is not divisible by 2 x --context-parallel-size "
                                f"{cp} = {2 * cp}: every rank holds two equal chunks of each sequence")
        sizes = args.hierarchical_context_parallel_sizes
        if "a2a+p2p" in types:
            if not sizes or len(sizes) != 2 or sizes[0] * sizes[1] != cp or min(sizes) < 1:
                raise ArgumentError(f"--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes U R "
                                    f"(Ulysses degree, ring size) with U x R = --context-parallel-size {cp}; "
                                    f"got {sizes}")
        elif sizes:
            raise ArgumentError("--hierarchical-context-parallel-sizes is only read with --cp-comm-type a2a+p2p")
        tp = args.tensor_model_parallel_size
        heads = args.num_attention_heads
        for t in set(types):
            degree = cp if t == "a2a" else sizes[0] if t == "a2a+p2p" else 1
            if degree > 1 and heads is not None and (heads // tp) % degree:
                raise ArgumentError(
                    f"--num-attention-heads {heads} is not divisible by --tensor-model-parallel-size {tp} x "
                    f"the Ulysses degree {degree} (--cp-comm-type {t}); Ulysses splits each rank's heads")
        if args.attention_dropout:
            raise ArgumentError(f"--context-parallel-size {cp} runs attention without dropout; "
                                f"add --attention-dropout 0.0")
        if getattr(args, "window_size", None) is not None:
            raise ArgumentError("--context-parallel-size > 1 does not support --window-size (sliding-window "
                                "attention) without Transformer Engine")
