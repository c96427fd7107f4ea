"""config.json's RoPE (``rope_scaling`` / ``rope_parameters``) as Megatron's position-embedding flags.

Kept apart from :mod:`adaptor.convert.megatron_args` so that a family mapping can refuse a RoPE setting
Megatron does not build when it reads config.json, without importing the model table.
"""
from __future__ import annotations

import math

from adaptor.convert.errors import ConversionError


def _rope_parameters(config: dict) -> dict:
    rope = dict(config.get("rope_scaling") or {})
    rope.update(config.get("rope_parameters") or {})
    if "rope_theta" in config:
        rope.setdefault("rope_theta", config["rope_theta"])
    return rope


def _rope_type(rope: dict) -> str:
    return rope.get("rope_type", rope.get("type")) or "default"


def _yarn_flags(config: dict, rope: dict) -> list[str]:
    """YaRN as transformers computes it (``_compute_yarn_parameters``), in Megatron's flags.

    Megatron's YarnRotaryEmbedding blends the same interpolated and extrapolated frequencies and
    scales cos/sin by get_mscale(factor, --mscale) / get_mscale(factor, --mscale-all-dim), with
    get_mscale(s, m) = 0.1 m ln(s) + 1. transformers uses that ratio when both mscales are given,
    else get_mscale(factor, 1), which is --mscale 1 --mscale-all-dim 0; an explicit
    ``attention_factor`` a is get_mscale(factor, m) with m = (a - 1) / (0.1 ln factor).
    """
    original = int(rope.get("original_max_position_embeddings") or config.get("max_position_embeddings") or 4096)
    factor = rope.get("factor")
    factor = float(factor) if factor is not None else config["max_position_embeddings"] / original
    mscale, mscale_all_dim = 1.0, 0.0
    if rope.get("attention_factor") is not None:
        wanted = float(rope["attention_factor"])
        if factor <= 1:
            if wanted != 1.0:
                raise ConversionError(f"rope_scaling: attention_factor {wanted:g} with factor {factor:g} <= 1 has "
                                      f"no Megatron equivalent (Megatron scales only when the factor is above 1)")
        else:
            mscale = (wanted - 1.0) / (0.1 * math.log(factor))
    elif rope.get("mscale") and rope.get("mscale_all_dim"):
        mscale, mscale_all_dim = float(rope["mscale"]), float(rope["mscale_all_dim"])
    flags = ["--rotary-scaling-factor", f"{factor:g}", "--yarn-original-max-position-embeddings", str(original),
             "--yarn-beta-fast", f"{float(rope.get('beta_fast') or 32):g}",
             "--yarn-beta-slow", f"{float(rope.get('beta_slow') or 1):g}",
             "--mscale", repr(mscale), "--mscale-all-dim", repr(mscale_all_dim)]
    if rope.get("truncate", True) is False:
        flags.append("--no-yarn-correction-range-round-to-int")
    return flags


# Megatron's Llama 3 RoPE scaling (--use-rope-scaling) fixes these; only its factor is a flag.
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _llama3_flags(config: dict, rope: dict) -> list[str]:
    """``rope_type: llama3`` as Megatron's --use-rope-scaling --rope-scaling-factor computes it."""
    for key, fixed in LLAMA3_FIXED.items():
        value = rope.get(key)
        if value is None and key == "original_max_position_embeddings":
            value = config.get("max_position_embeddings")  # transformers' fallback
        if value is None or float(value) != fixed:
            raise ConversionError(f"config.json: rope_scaling {key}={value!r} is not supported for rope_type llama3 "
                                  f"(Megatron's Llama 3 scaling fixes it at {fixed:g})")
    if rope.get("factor") is None:
        raise ConversionError("config.json: rope_scaling of rope_type llama3 has no factor")
    return ["--use-rope-scaling", "--rope-scaling-factor", f"{float(rope['factor']):g}"]


def position_flags(config: dict) -> list[str]:
    """A standard attention model's RoPE: plain, linear position interpolation, YaRN or Llama 3's scaling;
    others refused."""
    rope = _rope_parameters(config)
    kind = _rope_type(rope)
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConversionError(f"config.json: partial_rotary_factor={rope['partial_rotary_factor']!r} is not "
                              f"supported (RoPE on the whole head only)")
    if kind == "default":
        return ["--position-embedding-type", "rope"]
    if kind == "linear":
        factor = float(rope["factor"])
        if not factor.is_integer():
            raise ConversionError(f"config.json: linear rope_scaling factor {factor:g} is not a whole number, which "
                                  f"Megatron's --rotary-seq-len-interpolation-factor needs")
        return ["--position-embedding-type", "rope", "--rotary-seq-len-interpolation-factor", str(int(factor))]
    if kind == "yarn":
        return ["--position-embedding-type", "yarn"] + _yarn_flags(config, rope)
    if kind == "llama3":
        return ["--position-embedding-type", "rope"] + _llama3_flags(config, rope)
    raise ConversionError(f"config.json: rope_scaling type {kind!r} has no Megatron equivalent here "
                          f"(supported: default, linear, yarn, llama3)")
