"""The FSDP2 configuration: ``--fsdp2-config-path`` YAML, its checks and its defaults.

The keys are MindSpeed-MM's (see README "FSDP2"); a key we do not know, a value of the wrong
type and a pattern that cannot be read are each one :class:`Fsdp2ConfigError` naming the key.
Without a file (or for a key the file leaves out) the defaults are:

* ``sub_modules_to_wrap``: every transformer layer (and MTP layer, and vision block); with untied embeddings also
  the embedding and the output layer. With tied embeddings those two stay in the root unit,
  which shards them too and keeps the shared weight gathered for both of its uses;
* ``reshard_after_forward``: true, or false with Megatron's ``--torch-fsdp2-no-reshard-after-forward``;
* ``param_dtype``: bf16 under ``--bf16``, fp16 under ``--fp16``, else fp32; ``reduce_dtype``: fp32
  (fp16 is accepted there only under ``--fp16``, whose loss scaling keeps small gradients);
* ``offload_to_cpu``: false; ``ignored_modules``, ``recompute_modules``: none;
  ``num_to_forward_prefetch``: 0 (FSDP2's implicit prefetching only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from adaptor.fsdp2.patterns import ModulePattern, PatternError, compile_pattern

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "half": torch.float16, "fp32": torch.float32, "float32": torch.float32}
PATTERN_KEYS = ("sub_modules_to_wrap", "ignored_modules", "recompute_modules")
KEYS = PATTERN_KEYS + ("reshard_after_forward", "param_dtype", "reduce_dtype", "offload_to_cpu",
                       "num_to_forward_prefetch")

# Every transformer layer, wherever the model keeps it (a GPTModel's ``decoder.layers.3``, a
# LLaVAModel's ``language_model.decoder.layers.3`` and ``vision_model.decoder.layers.0``, a
# QwenVLModel's vision blocks ``vision_model.layers.0``).
DEFAULT_WRAP = ("*decoder.layers.{*}", "*mtp.layers.{*}", "*vision_model.layers.{*}")
DEFAULT_WRAP_UNTIED = ("*embedding", "*output_layer")


class Fsdp2ConfigError(ValueError):
    """A configuration problem, said in one line naming the key."""


@dataclass
class Fsdp2Config:
    """What the wrapper needs; ``None`` patterns mean the default plan."""

    sub_modules_to_wrap: Optional[list[ModulePattern]] = None
    ignored_modules: list[ModulePattern] = field(default_factory=list)
    recompute_modules: list[ModulePattern] = field(default_factory=list)
    reshard_after_forward: Optional[bool] = None
    param_dtype: Optional[torch.dtype] = None
    reduce_dtype: Optional[torch.dtype] = None
    offload_to_cpu: bool = False
    num_to_forward_prefetch: int = 0
    source: str = "defaults"  # the file, for messages

    def wrap_patterns(self, tied_embeddings: bool) -> tuple[list[ModulePattern], bool]:
        """The patterns of the units to shard, and whether the user gave them."""
        if self.sub_modules_to_wrap is not None:
            return self.sub_modules_to_wrap, True
        names = DEFAULT_WRAP + (() if tied_embeddings else DEFAULT_WRAP_UNTIED)
        return [compile_pattern(n) for n in names], False


def _patterns(key: str, value, where: str) -> list[ModulePattern]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Fsdp2ConfigError(f"{where}: {key} must be a list of module-name patterns "
                               f"(e.g. [\"decoder.layers.{{*}}\"]), got {value!r}")
    try:
        return [compile_pattern(v) for v in value]
    except PatternError as exc:
        raise Fsdp2ConfigError(f"{where}: {key}: {exc}") from None


def _dtype(key: str, value, where: str) -> torch.dtype:
    if not isinstance(value, str) or value.lower() not in DTYPES:
        raise Fsdp2ConfigError(f"{where}: {key} must be one of bf16, fp16, fp32, got {value!r}")
    return DTYPES[value.lower()]


def parse_config(data, where: str) -> Fsdp2Config:
    """Check a loaded YAML document (a mapping, or None for an empty file)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise Fsdp2ConfigError(f"{where}: the file must be a mapping of keys to values, got {type(data).__name__}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise Fsdp2ConfigError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)}")
    config = Fsdp2Config(source=where)
    for key in PATTERN_KEYS:
        if key in data:
            setattr(config, key, _patterns(key, data[key], where))
    if "reshard_after_forward" in data:
        value = data["reshard_after_forward"]
        if not isinstance(value, bool):
            raise Fsdp2ConfigError(f"{where}: reshard_after_forward must be true or false, got {value!r} "
                                   f"(resharding to a smaller group of ranks is not supported)")
        config.reshard_after_forward = value
    for key in ("param_dtype", "reduce_dtype"):
        if key in data:
            setattr(config, key, _dtype(key, data[key], where))
    if "offload_to_cpu" in data:
        if not isinstance(data["offload_to_cpu"], bool):
            raise Fsdp2ConfigError(f"{where}: offload_to_cpu must be true or false, got {data['offload_to_cpu']!r}")
        config.offload_to_cpu = data["offload_to_cpu"]
    if "num_to_forward_prefetch" in data:
        value = data["num_to_forward_prefetch"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Fsdp2ConfigError(f"{where}: num_to_forward_prefetch must be a non-negative integer, got {value!r}")
        config.num_to_forward_prefetch = value
    return config


def load_config(path: Optional[str]) -> Fsdp2Config:
    """Read ``--fsdp2-config-path`` (None: every default)."""
    if path is None:
        return Fsdp2Config()
    import yaml

    where = f"--fsdp2-config-path {path}"
    file = Path(path)
    if not file.is_file():
        raise Fsdp2ConfigError(f"{where}: no such file")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise Fsdp2ConfigError(f"{where}: not valid YAML{at}: {problem}") from None
    except UnicodeDecodeError:
        raise Fsdp2ConfigError(f"{where}: not UTF-8 text") from None
    return parse_config(data, where)


def compute_precision(args) -> tuple[torch.dtype, str, str]:
    """The compute dtype the command line asks for, its name, and the flag that says so."""
    if getattr(args, "bf16", False):
        return torch.bfloat16, "bf16", "--bf16 is given"
    if getattr(args, "fp16", False):
        return torch.float16, "fp16", "--fp16 is given"
    return torch.float32, "fp32", "neither --bf16 nor --fp16 is given"


def resolve_config(config: Fsdp2Config, args) -> Fsdp2Config:
    """Fill the defaults that depend on the command line and check the file against it."""
    where = config.source
    precision, want, flag = compute_precision(args)
    if config.param_dtype is None:
        config.param_dtype = precision
    elif config.param_dtype != precision:
        raise Fsdp2ConfigError(f"{where}: param_dtype must be {want} when {flag} (Megatron builds the model's "
                               f"precision-dependent parts from that flag); change param_dtype or the flag")
    if config.reduce_dtype is None:
        config.reduce_dtype = torch.float32
    elif config.reduce_dtype == torch.float16 and precision != torch.float16:
        raise Fsdp2ConfigError(f"{where}: reduce_dtype fp16 needs --fp16 (only fp16 training scales the loss, "
                               f"without which small fp16 gradients round to zero); use bf16 or fp32")
    flag_value = bool(getattr(args, "torch_fsdp2_reshard_after_forward", True))
    if config.reshard_after_forward is None:
        config.reshard_after_forward = flag_value
    elif not flag_value and config.reshard_after_forward is not False:
        raise Fsdp2ConfigError(f"{where}: reshard_after_forward true contradicts "
                               f"--torch-fsdp2-no-reshard-after-forward; drop one of them")
    if config.recompute_modules and getattr(args, "recompute_granularity", None):
        raise Fsdp2ConfigError(f"{where}: recompute_modules and --recompute-granularity both recompute "
                               f"activations; use one of them")
    finer = [flag for flag in ("recompute_norm", "recompute_activation_function") if getattr(args, flag, False)]
    if config.recompute_modules and finer:
        # a recomputed module would re-run the discarding checkpoint inside torch's checkpoint
        raise Fsdp2ConfigError(f"{where}: recompute_modules recomputes whole modules; drop it or "
                               f"--{finer[0].replace('_', '-')}")
    return config


def config_from_args(args) -> Fsdp2Config:
    return resolve_config(load_config(getattr(args, "fsdp2_config_path", None)), args)
