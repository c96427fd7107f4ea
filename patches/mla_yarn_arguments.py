"""YaRN flags for multi-latent attention: ``--yarn-original-max-position-embeddings``, ``--yarn-beta-fast/slow``.

Upstream: ``megatron.training.argument_utils.core_transformer_config_from_args`` copies args to
config fields of the same name. ``MLATransformerConfig`` names its YaRN fields
``original_max_position_embeddings``, ``beta_fast`` and ``beta_slow`` (defaults 4096, 32, 1), while
the command line spells them ``--yarn-original-max-position-embeddings``, ``--yarn-beta-fast``,
``--yarn-beta-slow``, and ``_apply_yarn_config_from_args`` skips MLA models. With
``--multi-latent-attention`` those flags were silently ignored (``--rotary-scaling-factor``,
``--mscale`` and ``--mscale-all-dim`` do reach MLA). The wrapper copies the given ones onto the
MLA config, where ``MultiLatentAttention`` reads them to build its ``YarnRotaryEmbedding``.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = "patches.mla_yarn_arguments"

# command-line dest -> MLATransformerConfig field
MLA_YARN_FIELDS = {
    "yarn_original_max_position_embeddings": "original_max_position_embeddings",
    "yarn_beta_fast": "beta_fast",
    "yarn_beta_slow": "beta_slow",
}


def _config_from_args(wrapped, instance, args, kwargs):
    config = wrapped(*args, **kwargs)
    margs = args[0] if args else kwargs["args"]
    if getattr(margs, "multi_latent_attention", False):
        for dest, field in MLA_YARN_FIELDS.items():
            value = getattr(margs, dest, None)
            if value is not None:
                setattr(config, field, value)
    return config


class MlaYarnArguments(Feature):
    name = "mla_yarn_arguments"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.argument_utils.core_transformer_config_from_args",
                            _config_from_args, OWNER)
