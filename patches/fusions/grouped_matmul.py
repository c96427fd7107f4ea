"""``--moe-grouped-gemm`` (Megatron's flag) without Transformer Engine.

Upstream: with TE the flag selects ``TEGroupedMLP``; on the local spec
(NPU, CPU, CUDA without TE) megatron-core builds ``SequentialMLP`` anyway,
one expert at a time. The feature's ``module_swaps`` row replaces it with
:class:`adaptor.ops.grouped_matmul.GroupedExperts`:
same parameters and checkpoints, one grouped matmul per linear
(npu_grouped_matmul / torch._grouped_mm / a CPU loop in one autograd node).

``megatron.training.arguments.validate_args`` asserts CUDA compute
capability >= 8 for the flag (a TE/cutlass kernel requirement); we skip only
that check when the local spec will be used, by hiding the flag from it.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature
from adaptor.wrapping import argument, overridden

OWNER = __name__


def _validate_args(wrapped, instance, call_args, kwargs):
    margs = argument(call_args, kwargs, "args")
    hide = bool(getattr(margs, "moe_grouped_gemm", False)) and margs.transformer_impl != "transformer_engine"
    if not hide:
        return wrapped(*call_args, **kwargs)
    with overridden(margs, moe_grouped_gemm=False):
        return wrapped(*call_args, **kwargs)


class GroupedMatmulFusion(Feature):
    name = "grouped_matmul"
    upstream_flags = ("--moe-grouped-gemm",)
    module_swaps = (
        ("moe_grouped_gemm", "megatron.core.transformer.moe.experts:SequentialMLP",
         "adaptor.ops.grouped_matmul:GroupedExperts"),
    )

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "moe_grouped_gemm", False))

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.arguments.validate_args", _validate_args, OWNER)

    def validate(self, args, ctx) -> None:
        if not getattr(args, "moe_grouped_gemm", False) or args.transformer_impl == "transformer_engine":
            return
        if getattr(args, "fp8", None) or getattr(args, "fp4", None):
            raise ArgumentError("--moe-grouped-gemm without Transformer Engine does not support --fp8/--fp4")
