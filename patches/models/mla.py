"""``--multi-latent-attention`` (DeepSeek-V3's MLA) on megatron-core's local spec.

Two upstream gaps, closed in one feature:

* Core attention: the local spec builds ``megatron.core.transformer.dot_product_attention.
  DotProductAttention`` for MLA, which does not take MLA's ``k_channels``/``v_channels``; the
  ``module_swaps`` row puts ``adaptor.ops.mla_attention.MLADotProductAttention`` there
  (``--use-flash-attn``, later in the registry, swaps it for the fused attention).
* YaRN flags: ``megatron.training.argument_utils.core_transformer_config_from_args`` copies args by
  name, but ``MLATransformerConfig`` names them ``original_max_position_embeddings``, ``beta_fast``,
  ``beta_slow`` and ``_apply_yarn_config_from_args`` skips MLA, so ``--yarn-original-max-position-embeddings``,
  ``--yarn-beta-fast``, ``--yarn-beta-slow`` were silently ignored; the wrapper copies them over.

Remove when: megatron-core's ``DotProductAttention`` takes ``k_channels``/``v_channels`` (open:
https://github.com/NVIDIA/Megatron-LM/issues/1589, PR
https://github.com/NVIDIA/Megatron-LM/pull/6564) and ``core_transformer_config_from_args`` copies
the ``--yarn-*`` flags onto an MLA config (no upstream issue or PR found); each part can go on its
own. Neither is fixed in megatron-core 0.19.2 nor on Megatron-LM main (d98e8a64, 2026-08-22).
"""
from __future__ import annotations

from adaptor.features import Feature
from adaptor.wrapping import argument

OWNER = __name__

# command-line dest -> MLATransformerConfig field
MLA_YARN_FIELDS = {
    "yarn_original_max_position_embeddings": "original_max_position_embeddings",
    "yarn_beta_fast": "beta_fast",
    "yarn_beta_slow": "beta_slow",
}


def _config_from_args(wrapped, instance, call_args, kwargs):
    config = wrapped(*call_args, **kwargs)
    margs = argument(call_args, kwargs, "args")
    if getattr(margs, "multi_latent_attention", False):
        for dest, field in MLA_YARN_FIELDS.items():
            value = getattr(margs, dest, None)
            if value is not None:
                setattr(config, field, value)
    return config


class MlaWithoutTransformerEngine(Feature):
    name = "mla"
    upstream_flags = ("--multi-latent-attention",)
    module_swaps = (
        ("multi_latent_attention", "megatron.core.transformer.dot_product_attention:DotProductAttention",
         "adaptor.ops.mla_attention:MLADotProductAttention"),
    )

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "multi_latent_attention", False))

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.argument_utils.core_transformer_config_from_args",
                            _config_from_args, OWNER)
