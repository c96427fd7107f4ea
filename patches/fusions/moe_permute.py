"""``--moe-permute-fusion`` (Megatron's flag) without Transformer Engine.

Upstream: ``megatron.core.transformer.moe.moe_utils.permute``,
``unpermute`` and ``sort_chunks_by_idxs`` call TE's fused kernels when
``fused=True`` (the dispatchers pass ``config.moe_permute_fusion``), and
``TransformerConfig.__post_init__`` refuses the flag unless those kernels
import. We wrap the three functions: with ``fused=True`` permute/unpermute
run :mod:`adaptor.ops.moe_permute` (NPU kernels or an index-based torch
version, equal to the unfused results) and sort_chunks_by_idxs runs
upstream's unfused code; and we fill moe_utils' ``fused_*`` names (None
without TE) with ours so the config check passes. With TE present and
``--transformer-impl transformer_engine`` nothing is changed.
"""
from __future__ import annotations


from adaptor.features import ArgumentError, Feature
from adaptor.wrapping import call_arguments

OWNER = __name__
MOE_UTILS = "megatron.core.transformer.moe.moe_utils"


def _permute(wrapped, instance, call_args, kwargs):
    a = call_arguments(wrapped, call_args, kwargs, defaults=True)
    if not a["fused"] or a["drop_and_pad"]:
        return wrapped(*call_args, **kwargs) if not a["fused"] else wrapped(**{**a, "fused": False})
    from adaptor.ops.moe_permute import permute

    out, probs, row_id_map = permute(a["tokens"], a["routing_map"], a["probs"], a["num_out_tokens"])
    return out, probs, row_id_map, None, a["tokens_per_expert"]


def _unpermute(wrapped, instance, call_args, kwargs):
    a = call_arguments(wrapped, call_args, kwargs, defaults=True)
    if not a["fused"] or a["drop_and_pad"]:
        return wrapped(*call_args, **kwargs) if not a["fused"] else wrapped(**{**a, "fused": False})
    from adaptor.ops.moe_permute import unpermute

    return unpermute(a["permuted_tokens"], a["sorted_indices"], a["restore_shape"], a["probs"])


def _sort_chunks_by_idxs(wrapped, instance, call_args, kwargs):
    a = call_arguments(wrapped, call_args, kwargs, defaults=True)
    return wrapped(**{**a, "fused": False})


def _fused_permute(tokens, routing_map, num_out_tokens=None):
    from adaptor.ops.moe_permute import permute

    out, _, row_id_map = permute(tokens, routing_map, None, num_out_tokens)
    return out, row_id_map


def _fused_permute_with_probs(tokens, probs, routing_map, num_out_tokens=None):
    from adaptor.ops.moe_permute import permute

    return permute(tokens, routing_map, probs, num_out_tokens)


def _fused_unpermute(permuted_tokens, row_id_map, merging_probs=None, restore_shape=None, **_):
    from adaptor.ops.moe_permute import unpermute

    return unpermute(permuted_tokens, row_id_map, restore_shape, merging_probs)


def _fused_sort_chunks_by_index(input, split_sizes, sorted_idxs):
    from megatron.core.transformer.moe import moe_utils

    return moe_utils.sort_chunks_by_idxs(input, split_sizes, sorted_idxs)[0]


def _fused_sort_chunks_by_index_with_probs(input, probs, split_sizes, sorted_idxs):
    from megatron.core.transformer.moe import moe_utils

    return moe_utils.sort_chunks_by_idxs(input, split_sizes, sorted_idxs, probs=probs)


class MoePermuteFusion(Feature):
    name = "moe_permute"
    upstream_flags = ("--moe-permute-fusion",)

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "moe_permute_fusion", False))

    def register_patches(self, pm, ctx) -> None:
        from megatron.core.transformer.moe import moe_utils

        if moe_utils.fused_permute is not None:
            return  # Transformer Engine's kernels are there: upstream uses them.
        pm.register_wrapper(f"{MOE_UTILS}.permute", _permute, OWNER)
        pm.register_wrapper(f"{MOE_UTILS}.unpermute", _unpermute, OWNER)
        pm.register_wrapper(f"{MOE_UTILS}.sort_chunks_by_idxs", _sort_chunks_by_idxs, OWNER)
        for name, fn in (
            ("fused_permute", _fused_permute),
            ("fused_permute_with_probs", _fused_permute_with_probs),
            ("fused_unpermute", _fused_unpermute),
            ("fused_sort_chunks_by_index", _fused_sort_chunks_by_index),
            ("fused_sort_chunks_by_index_with_probs", _fused_sort_chunks_by_index_with_probs),
        ):
            pm.register_replacement(f"{MOE_UTILS}.{name}", fn, OWNER)

    def validate(self, args, ctx) -> None:
        if not getattr(args, "moe_permute_fusion", False):
            return
        if ctx.backend.name == "npu" and getattr(args, "moe_expert_capacity_factor", None) is not None:
            raise ArgumentError(
                "--moe-permute-fusion on NPU needs every token routed to --moe-router-topk experts; "
                "drop --moe-expert-capacity-factor or --moe-permute-fusion"
            )
