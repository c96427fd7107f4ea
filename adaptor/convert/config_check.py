"""Does a Hugging Face config.json describe the model the Megatron flags build?

``--hf-load-dir`` and ``--hf-save-dir`` compare the flags :func:`megatron_args_from_hf_config`
derives from config.json with the parsed command line (both through Megatron's own parser), and
report the first architecture setting that differs, named by its flag.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from adaptor.features import ArgumentError

# config.json model_type -> the family (--model-type-hf name, a row of adaptor.convert.models.MODELS)
HF_MODEL_TYPES = {"qwen3": "qwen3", "deepseek_v3": "deepseek3", "llama": "llama2", "qwen2": "qwen2",
                  "qwen3_moe": "qwen3-moe", "mixtral": "mixtral"}
# Flags of megatron_args_from_hf_config that do not describe the weights: not compared.


NOT_COMPARED = {
    "vocab_size", "padded_vocab_size", "make_vocab_size_divisible_by", "max_position_embeddings",
    "seq_length", "tokenizer_type", "tokenizer_model", "attention_dropout", "hidden_dropout",
    "init_method_std", "bf16", "fp16", "moe_aux_loss_coeff", "moe_router_load_balancing_type",
    "moe_token_dispatcher_type", "moe_grouped_gemm", "moe_router_dtype", "mtp_loss_scaling_factor",
    "moe_z_loss_coeff", "moe_router_bias_update_rate", "use_mcore_models", "transformer_impl",
}
# Architecture switches compared even when the HF-derived flags leave them out (then: off).


ARCHITECTURE_SWITCHES = (
    "qk_layernorm", "multi_latent_attention", "untie_embeddings_and_output_weights", "swiglu",
    "add_qkv_bias", "moe_router_enable_expert_bias", "rotary_interleaved", "use_rope_scaling",
    "moe_router_pre_softmax",
)


# No family here scales its norms by 1 + weight; a stored gamma would be read as the scale itself.
ZERO_CENTRED_GAMMA = ("--apply-layernorm-1p is on, but the norms of the Hugging Face families converted here scale "
                      "by their weight, not by 1 + weight; drop the flag for these models")


def hf_model_type(config: dict, given: str | None, where: str) -> str:
    """``--model-type-hf`` or the one config.json's ``model_type`` names."""
    if given:
        return given
    found = config.get("model_type")
    if found not in HF_MODEL_TYPES:
        families = "|".join(dict.fromkeys(HF_MODEL_TYPES.values()))
        raise ArgumentError(f"{where}: config.json has model_type {found!r}; supported: "
                            f"{', '.join(sorted(HF_MODEL_TYPES))} (or pass --model-type-hf {families})")
    return HF_MODEL_TYPES[found]


def read_hf_config(directory: str, flag: str) -> dict:
    path = Path(directory)
    if not path.is_dir():
        raise ArgumentError(f"{flag} {directory}: no such directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ArgumentError(f"{flag} {directory}: no config.json in the directory")
    try:
        return json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"{flag} {config_file}: not a JSON file ({exc})") from None


def model_flags(model_type: str, config: dict) -> list[str]:
    """The pretrain_gpt.py model flags that build what config.json describes."""
    from adaptor.convert.megatron_args import megatron_args_from_hf_config

    return list(megatron_args_from_hf_config(model_type, config))


def _option_strings(parser) -> dict[str, str]:
    return {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}


def megatron_namespace(flags: list[str]):
    """Parse Megatron flags with Megatron's own parser (defaults for the rest)."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(add_help=False, allow_abbrev=False))
    namespace, _ = parser.parse_known_args(flags)
    given = {a.split("=", 1)[0] for a in flags if a.startswith("--")}
    dests = {a.dest for a in parser._actions if any(o in given for o in a.option_strings)}
    return namespace, dests, _option_strings(parser)


def normalized_value(dest: str, value, args):
    if dest == "moe_layer_freq" and isinstance(value, int):
        return [1 if i % value == 0 else 0 for i in range(args.num_layers)]
    if isinstance(value, tuple):
        return list(value)
    return value


def _query_groups(ns) -> int | None:
    if getattr(ns, "multi_latent_attention", False):
        return None
    return ns.num_query_groups if getattr(ns, "group_query_attention", False) else ns.num_attention_heads


def config_mismatch(args, hf_flags: list[str]) -> str | None:
    """The first setting where ``args`` differs from the model ``hf_flags`` describe, as a phrase."""
    if getattr(args, "layernorm_zero_centered_gamma", False):
        return ZERO_CENTRED_GAMMA
    hf, given, options = megatron_namespace(hf_flags)
    compared = (given | set(ARCHITECTURE_SWITCHES)) - NOT_COMPARED
    if not getattr(hf, "group_query_attention", False):
        compared.discard("num_query_groups")
    first = ("num_layers", "hidden_size", "multi_latent_attention", "num_attention_heads", "num_experts")
    for dest in sorted(compared, key=lambda d: (first.index(d) if d in first else len(first), d)):
        if dest == "num_query_groups" or dest == "group_query_attention":
            mine, theirs = _query_groups(args), _query_groups(hf)
        else:
            mine = normalized_value(dest, getattr(args, dest, None), args)
            theirs = normalized_value(dest, getattr(hf, dest, None), args)
        if dest == "kv_channels" and getattr(hf, "multi_latent_attention", False):
            continue
        same = mine == theirs
        if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)) and not isinstance(mine, bool):
            same = math.isclose(float(mine), float(theirs), rel_tol=1e-9, abs_tol=0.0)
        if not same:
            flag = options.get(dest, "--" + dest.replace("_", "-"))
            if dest in ("num_query_groups", "group_query_attention"):
                flag = "--num-query-groups (--group-query-attention)"
            return f"{flag} is {mine!r} on the command line but {theirs!r} in the Hugging Face config"
    return None
