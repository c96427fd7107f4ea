"""``--apply-layernorm-1p`` (``layernorm_zero_centered_gamma``) on the local layer spec.

Upstream: ``megatron.core.transformer.torch_norm.WrappedTorchNorm.__new__`` (the local spec's norm
without apex, as on NPU and CPU) asserts "zero_centered_gamma not supported by torch LayerNorm", so
Gemma-style models, whose norms scale by ``1 + gamma`` with gamma starting at zero, could not be
built without Transformer Engine or apex. The wrapper builds the torch norm with the assert skipped
and turns it in place into ``adaptor.ops.zero_centered_norm``'s subclass (``(1 + weight)`` with
weight zeros), keeping its parameter objects so the sequence-parallel marks stay. Every norm the
local spec builds goes through ``WrappedTorchNorm``: the layers' input and pre-MLP norms, the final
norm, qk-layernorm, MLA's q/kv norms and the MTP norms. ``--use-fused-rmsnorm``'s ``FusedRMSNorm``
honours the flag itself. The stored parameter is gamma, as apex and TE store it.
"""
from __future__ import annotations

from adaptor.errors import ArgumentError
from adaptor.features import Feature
from adaptor.wrapping import overridden, transformer_config

OWNER = __name__
NORMS = ("LayerNorm", "RMSNorm")


def _torch_norm_new(wrapped, instance, call_args, kwargs):
    from adaptor.ops.zero_centered_norm import zero_centre

    config = transformer_config(call_args, kwargs)
    if not config.layernorm_zero_centered_gamma:
        return wrapped(*call_args, **kwargs)
    with overridden(config, layernorm_zero_centered_gamma=False):  # hide it from the assert only
        norm = wrapped(*call_args, **kwargs)
    return zero_centre(norm)


class Layernorm1p(Feature):
    name = "layernorm_1p"
    upstream_flags = ("--apply-layernorm-1p",)

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "apply_layernorm_1p", False))

    def validate(self, args, ctx) -> None:
        if args.normalization not in NORMS:
            raise ArgumentError(f"--apply-layernorm-1p needs --normalization LayerNorm or RMSNorm "
                                f"({args.normalization} has no gamma)")

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.core.transformer.torch_norm.WrappedTorchNorm.__new__", _torch_norm_new, OWNER)
