"""Recompute without Transformer Engine: Megatron's ``--recompute-*`` flags and MindSpeed's.

Megatron's ``--recompute-granularity``/``--recompute-method``/``--recompute-num-layers`` run as
upstream on the local spec. Four ``--recompute-modules`` choices (layernorm, moe_act, mla_up_proj, gdn_norm_out) use
``megatron.core.tensor_parallel.random.CheckpointWithoutOutput``, which needed TE;
``adaptor.memory.recompute`` fixes its ``__init__`` and ``_get_share_storage`` where TE is missing.
``moe_act`` upstream covers TE's grouped experts only; for the local experts a wrapper of
megatron-core's ``MLP.forward`` recomputes a marked MLP's activation.

MindSpeed's ``--recompute-norm [--recompute-norm-num-layers N]`` and ``--recompute-activation-function
[--recompute-activation-function-num-layers N]`` mark chosen layers (``adaptor.memory.recompute.mark_layers``
via ``megatron.core.transformer.transformer_block.TransformerBlock._build_layers``; the flags reach
the layers through ``megatron.training.argument_utils.core_transformer_config_from_args``).
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature

OWNER = __name__

#: MindSpeed's switch -> its layer count, both copied onto the TransformerConfig.
SWITCHES = {
    "recompute_norm": "recompute_norm_num_layers",
    "recompute_activation_function": "recompute_activation_function_num_layers",
}
MEGATRON_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                    "gdn_norm_out")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _config_from_args(wrapped, instance, call_args, kwargs):
    from adaptor.wrapping import argument

    config = wrapped(*call_args, **kwargs)
    margs = argument(call_args, kwargs, "args")
    for switch, count in SWITCHES.items():
        setattr(config, switch, bool(getattr(margs, switch, False)))
        setattr(config, count, getattr(margs, count, None))
    return config


def _transformer_engine_missing() -> bool:
    from megatron.core.tensor_parallel import random

    return not random.HAVE_TE


class Recompute(Feature):
    name = "recompute"

    def add_arguments(self, group) -> None:
        group.add_argument("--recompute-norm", action="store_true", dest="recompute_norm",
                           help="Recompute the input and pre-MLP norms' outputs in backward (MindSpeed); "
                                "Megatron's --recompute-modules layernorm, per layer.")
        group.add_argument("--recompute-norm-num-layers", type=int, default=None,
                           dest="recompute_norm_num_layers",
                           help="With --recompute-norm: only the first N layers of each pipeline stage "
                                "(after the layers --recompute-method block recomputes whole).")
        group.add_argument("--recompute-activation-function", action="store_true",
                           dest="recompute_activation_function",
                           help="Recompute the MLP activation in backward (MindSpeed): keep fc1's output, "
                                "drop the activation's.")
        group.add_argument("--recompute-activation-function-num-layers", type=int, default=None,
                           dest="recompute_activation_function_num_layers",
                           help="With --recompute-activation-function: only the first N layers of each "
                                "pipeline stage (after the layers --recompute-method block recomputes whole).")

    def register_patches(self, pm, ctx) -> None:
        from adaptor.memory import recompute

        if _transformer_engine_missing():
            pm.register_wrapper("megatron.core.tensor_parallel.random.CheckpointWithoutOutput.__init__",
                                recompute.fp8_only_when_asked, OWNER)
            pm.register_replacement("megatron.core.tensor_parallel.random._get_share_storage",
                                    recompute.storage_copier, OWNER)
        pm.register_wrapper("megatron.training.argument_utils.core_transformer_config_from_args",
                            _config_from_args, OWNER)
        pm.register_wrapper("megatron.core.transformer.transformer_block.TransformerBlock._build_layers",
                            recompute.build_layers_then_mark, OWNER)
        pm.register_wrapper("megatron.core.transformer.mlp.MLP.forward", recompute.mlp_forward, OWNER)

    def validate(self, args, ctx) -> None:
        for switch, count in SWITCHES.items():
            value = getattr(args, count, None)
            if value is None:
                continue
            if not getattr(args, switch, False):
                raise ArgumentError(f"{_flag(count)} needs {_flag(switch)}")
            if not 0 <= value <= args.num_layers:
                raise ArgumentError(f"{_flag(count)} must be between 0 and --num-layers ({args.num_layers}), "
                                    f"got {value}")
        mindspeed = [_flag(s) for s in SWITCHES if getattr(args, s, False)]
        if mindspeed and args.recompute_granularity == "full" and args.recompute_method != "block":
            raise ArgumentError(f"{mindspeed[0]} with --recompute-granularity full needs --recompute-method block "
                                "(the first --recompute-num-layers layers recomputed whole, the next ones finer)")
        self._validate_modules(args)

    @staticmethod
    def _validate_modules(args) -> None:
        modules = getattr(args, "recompute_modules", None)
        if modules is None:
            return
        selective = args.recompute_granularity == "selective" or getattr(args, "recompute_activations", False)
        if not selective:
            raise ArgumentError("--recompute-modules needs --recompute-granularity selective "
                                "(full recompute recomputes whole layers)")
        unknown = [m for m in modules if m not in MEGATRON_MODULES]
        if unknown:
            raise ArgumentError(f"--recompute-modules {unknown[0]}: not a module Megatron recomputes; "
                                f"choose from {', '.join(MEGATRON_MODULES)}")
        if "gdn_norm_out" in modules and getattr(args, "experimental_attention_variant", None) != "gated_delta_net":
            raise ArgumentError("--recompute-modules gdn_norm_out recomputes gated-delta-net layers, and this model "
                                "has none (--experimental-attention-variant gated_delta_net)")
        if "moe_act" in modules and not getattr(args, "moe_grouped_gemm", False):
            raise ArgumentError("--recompute-modules moe_act needs --moe-grouped-gemm (as in Megatron); "
                                "or use --recompute-activation-function, which also covers SequentialMLP experts")
        if "mla_up_proj" in modules and not getattr(args, "multi_latent_attention", False):
            raise ArgumentError("--recompute-modules mla_up_proj needs --multi-latent-attention")
        moe_only = [m for m in ("moe_act", "moe", "shared_experts") if m in modules]
        if moe_only and not getattr(args, "num_experts", None):
            raise ArgumentError(f"--recompute-modules {moe_only[0]} recomputes MoE layers, and this model has none "
                                "(--num-experts); use mlp for dense layers")
