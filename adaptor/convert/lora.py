"""LoRA adapters between Megatron's fused, tensor-parallel linears and PEFT's per-projection layout.

Megatron adapts a whole linear (``lora_A`` [r, in], ``lora_B`` [out, r], split over TP as
:mod:`adaptor.lora.layers` says); PEFT (``peft_type: LORA``) adapts each HF projection with the same
formula. A fused linear (``linear_qkv``, ``linear_fc1``) stacks projections on the output dimension,
so its A is every projection's ``lora_A`` and B splits by the base weight's own rule
(:mod:`adaptor.convert.layout`); an adapter with different A's per projection is refused.

* :func:`lora_mapping`: the adapter as a :class:`~adaptor.convert.mapping.ModelMapping`, placed at
  any TP/PP layout by the usual export/import functions;
* :func:`merge_lora_state`: a rank's state with ``W + scaling * B @ A`` and no adapter tensors;
* :func:`write_peft_adapter` / :class:`PeftAdapter`: the PEFT directory (``adapter_config.json`` +
  ``adapter_model.safetensors``) written (all or nothing) from, and read into, Megatron rank states.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import Layout, Replicated, Split
from adaptor.convert.mapping import ModelMapping, Param

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the transformers model
PEFT_VERSION = "0.21.2"            # the release whose adapter_config.json fields are written
LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
HF_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HF_TO_LINEAR = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "o_proj": "linear_proj",
                "gate_proj": "linear_fc1", "up_proj": "linear_fc1", "down_proj": "linear_fc2"}


@dataclass(frozen=True)
class LoraSettings:
    r: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]  # Megatron linear names (linear_qkv, ...)

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


def settings_from_args(args) -> LoraSettings | None:
    """The run's LoRA settings, or None when LoRA is off."""
    r = getattr(args, "lora_r", None)
    if not r:
        return None
    targets = getattr(args, "lora_target_modules", None) or LINEARS
    return LoraSettings(int(r), float(getattr(args, "lora_alpha", None) or r),
                        float(getattr(args, "lora_dropout", None) or 0.0), tuple(targets))


class SharedA:
    """The A of a column-parallel fused linear: the one tensor every HF projection's lora_A is."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def shard(self, hf, rank, size):
        for name, other in zip(self.names[1:], hf[1:]):
            if not torch.equal(hf[0], other):
                raise ConversionError(
                    f"{name} differs from {self.names[0]}: Megatron's fused linear has one lora_A for "
                    f"{', '.join(_module(n) for n in self.names)}; an adapter with separate A's per projection "
                    f"cannot be loaded at the same rank")
        return hf[0]

    def merge(self, parts):
        return [parts[0]] * len(self.names)


def _module(peft_name: str) -> str:
    """``...layers.0.self_attn.q_proj.lora_A.weight`` -> ``q_proj``."""
    parts = peft_name.split(".")
    return parts[-3] if len(parts) >= 3 else peft_name


def peft_name(hf_weight: str, which: str) -> str:
    """PEFT's saved name of an HF projection's lora_A / lora_B: ``base_model.model.<module>.lora_A.weight``."""
    return f"{PEFT_PREFIX}{hf_weight.removesuffix('.weight')}.{which}.weight"


def _is_row_parallel(rule) -> bool:
    return isinstance(rule, Split) and rule.dim == 1


def _linear_of(param: Param, targets) -> str | None:
    parts = param.megatron.split(".")
    if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in targets:
        return parts[-2]
    return None


def lora_params(base: ModelMapping, padded_vocab: int, targets) -> list[Param]:
    """The lora_A / lora_B params of every linear of `base` named in `targets`, with PEFT names."""
    out = []
    for param in base.params(padded_vocab):
        if not (param.to_hf and param.to_megatron) or _linear_of(param, targets) is None:
            continue
        prefix = param.megatron.removesuffix("weight")
        common = dict(place=param.place, layer=param.layer, expert=param.expert)
        names_a = tuple(peft_name(h, "lora_A") for h in param.hf)
        names_b = tuple(peft_name(h, "lora_B") for h in param.hf)
        if _is_row_parallel(param.rule):
            if len(param.hf) != 1:
                raise ConversionError(f"internal: row-parallel {param.megatron} maps to {len(param.hf)} tensors")
            out.append(Param(prefix + "lora_A.weight", names_a, param.rule, param.parallel, **common))
            out.append(Param(prefix + "lora_B.weight", names_b, Replicated(), None, **common))
        elif param.parallel is not None or len(param.hf) > 1:  # column-parallel (QKV, gate/up, Split(0))
            out.append(Param(prefix + "lora_A.weight", names_a, SharedA(names_a), None, **common))
            out.append(Param(prefix + "lora_B.weight", names_b, param.rule, param.parallel, **common))
        else:
            raise ConversionError(f"{param.megatron}: LoRA on a replicated weight is not supported")
    return out


class LoraMapping(ModelMapping):
    """The adapter tensors of a model, placed as the base model's weights are (same stages and ranks)."""

    def __init__(self, base: ModelMapping, targets, keep=None):
        self.__dict__.update(vars(base))
        self.model_type = base.model_type
        self.base, self.targets, self.keep = base, tuple(targets), keep

    def params(self, padded_vocab: int) -> list[Param]:
        params = lora_params(self.base, padded_vocab, self.targets)
        return [p for p in params if self.keep is None or self.keep(p)]

    def check_layout(self, layout: Layout) -> None:
        self.base.check_layout(layout)


def lora_mapping(base: ModelMapping, targets, keep=None) -> LoraMapping:
    return LoraMapping(base, targets, keep)


# ----------------------------------------------------------------------------- merged weights
def merge_lora_state(state: dict, scalings: dict[str, float | None]) -> dict:
    """``state`` with each adapted ``<linear>.weight`` replaced by ``W + scaling * B @ A`` (computed in fp32,
    stored in W's dtype) and the ``lora_A`` / ``lora_B`` tensors removed. `scalings`: linear name -> alpha / r,
    or None for a linear whose weight holds the adapters already (only its adapter tensors are dropped).

    On a tensor rank this is the rank's part of the merged weight: a column-parallel rank holds its rows
    of W and B and all of A, a row-parallel rank its columns of W and A and all of B.
    """
    merged = dict(state)
    for linear, scaling in scalings.items():
        a, b = merged.pop(f"{linear}.lora_A.weight"), merged.pop(f"{linear}.lora_B.weight")
        if scaling is None:
            continue
        weight = merged[f"{linear}.weight"]
        merged[f"{linear}.weight"] = (weight.float() + scaling * (b.float() @ a.float())).to(weight.dtype)
    left = [name for name in merged if ".lora_A." in name or ".lora_B." in name]
    if left:
        raise ConversionError(f"internal: adapter tensor {left[0]} has no LoRA scaling to merge with")
    return merged


# ----------------------------------------------------------------------------- PEFT directories
def _alpha_value(alpha: float):
    return int(alpha) if float(alpha).is_integer() else float(alpha)


def target_modules(names: list[str], all_hf_weights: list[str]):
    """adapter_config.json's target_modules: the projections' short names when those name exactly the
    adapted modules (PEFT matches a short name against every module ending with it), else the full names."""
    modules = sorted({n.removeprefix(PEFT_PREFIX).rsplit(".", 2)[0] for n in names})
    short = sorted({m.rsplit(".", 1)[-1] for m in modules},
                   key=lambda s: (HF_ORDER.index(s) if s in HF_ORDER else len(HF_ORDER), s))
    every = {w.removesuffix(".weight") for w in all_hf_weights}
    matched = {m for m in every if m.rsplit(".", 1)[-1] in short}
    return short if matched == set(modules) else modules


def adapter_config(settings: LoraSettings, targets, base_model: str | None) -> dict:
    """adapter_config.json as PEFT 0.21 writes it for a plain LoRA adapter of a causal LM."""
    return {
        "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None, "auto_mapping": None,
        "base_model_name_or_path": base_model, "bias": "none", "corda_config": None,
        "ensure_weight_tying": False, "eva_config": None, "exclude_modules": None, "fan_in_fan_out": False,
        "inference_mode": True, "init_lora_weights": True, "kasa_config": None, "layer_replication": None,
        "layers_pattern": None, "layers_to_transform": None, "loftq_config": {},
        "lora_alpha": _alpha_value(settings.alpha), "lora_bias": False, "lora_dropout": settings.dropout,
        "lora_ga_config": None, "megatron_config": None, "megatron_core": "megatron.core",
        "modules_to_save": None, "monteclora_config": None, "peft_type": "LORA", "peft_version": PEFT_VERSION,
        "qalora_group_size": 16, "r": settings.r, "rank_pattern": {}, "revision": None,
        "target_modules": targets, "target_parameters": None, "task_type": "CAUSAL_LM",
        "trainable_token_indices": None, "use_bdlora": None, "use_dora": False, "use_qalora": False,
        "use_rslora": False, "velora_config": None,
    }


def _check_linears(mapping: LoraMapping, settings: LoraSettings) -> None:
    found = {p.megatron.split(".")[-3] for p in mapping.params(mapping.vocab_size)}
    missing = [t for t in settings.targets if t not in found]
    if missing:
        raise ConversionError(f"the model has no LoRA tensors of {missing[0]} (--lora-target-modules names it)")
    experts = [p.megatron for p in mapping.params(mapping.vocab_size) if p.expert is not None]
    if experts:
        raise ConversionError(f"{experts[0].format(layer=0, expert=0)}: adapters of routed experts have no PEFT "
                              f"layout; export them merged (--hf-save-lora merged)")


def write_peft_adapter(get, has, save_dir, model_type: str, hf_config: dict, layout: Layout,
                       settings: LoraSettings, base_model: str | None = None, flag: str = "--save-dir") -> list[str]:
    """Write the directory `save_dir` (empty or new): adapter_config.json + adapter_model.safetensors
    from Megatron rank states.

    `get((tp, pp, ep), name)` reads a rank's tensor and `has((tp, pp, ep), name)` says whether that rank
    holds it; linears of the target types the model does not adapt (MLA's, say) are left out. Returns
    the PEFT tensor names.
    """
    from adaptor.checkpoint.files import staged_directory
    from adaptor.convert.models import model_mapping
    from adaptor.convert.tensors import hf_tensors_from_megatron
    from adaptor.safetensors_file import write_file

    base = model_mapping(model_type, hf_config)
    base.check_layout(layout)

    def keep(param):
        stage = mapping.stage_of(param, layout)[0]
        return has((0, stage, mapping.ep_rank_of(param, layout) or 0), mapping.local_name(param, layout))

    mapping = lora_mapping(base, settings.targets, keep)
    _check_linears(mapping, settings)
    tensors = [(name, tensor.contiguous()) for name, tensor in hf_tensors_from_megatron(
        get, mapping, hf_config, layout, padded_vocab_size=base.vocab_size)]
    for name, tensor in tensors:
        if tuple(tensor.shape)[name.endswith("lora_B.weight")] != settings.r:
            raise ConversionError(f"{name}: shape {list(tensor.shape)} does not have rank --lora-r {settings.r}")
    names = [name for name, _ in tensors]
    all_weights = [h for p in base.params(base.vocab_size) if p.to_hf for h in p.hf]
    config = adapter_config(settings, target_modules(names, all_weights), base_model)
    with staged_directory(save_dir, flag, ConversionError) as temp:
        write_file(temp / WEIGHTS_FILE, tensors, {"format": "pt"})
        (temp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return names


def peft_adapter_from_rank_files(iteration_dir, save_dir, model_type: str, hf_config: dict, layout: Layout,
                                 settings: LoraSettings, base_model: str | None = None,
                                 flag: str = "--save-dir") -> list[str]:
    """:func:`write_peft_adapter` from the rank files of one iteration directory at `layout`
    (:class:`~adaptor.convert.torch_legacy.RankStates`: legacy torch files or safetensors)."""
    from adaptor.convert.torch_legacy import RankStates

    states = RankStates(iteration_dir, layout)
    return write_peft_adapter(states.get, states.has, save_dir, model_type, hf_config, layout, settings, base_model,
                              flag)


def is_peft_adapter(path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


class PeftAdapter:
    """A PEFT LoRA directory, read as the adapter of Megatron's fused linears.

    Refused, one line each: another PEFT method, DoRA, rsLoRA, per-module ranks or alphas, biases,
    ``modules_to_save``, fan-in-fan-out weights, pickled weights (``adapter_model.bin``), and tensors
    the model's targeted linears do not take or leave without a value.
    """

    def __init__(self, path):
        from adaptor.safetensors_file import SafetensorsError, SafetensorsFile

        self.path = Path(path)
        config_file = self.path / CONFIG_FILE
        try:
            self.config = json.loads(config_file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConversionError(f"{config_file}: cannot read ({exc})") from None
        c = self.config
        checks = [
            (c.get("peft_type") == "LORA", f"peft_type {c.get('peft_type')!r} (only LORA adapters load)"),
            (not c.get("use_dora"), "use_dora: true (DoRA has a magnitude vector LoRA lacks)"),
            (not c.get("use_rslora"), "use_rslora: true (its scaling is alpha/sqrt(r))"),
            (not c.get("rank_pattern") and not c.get("alpha_pattern"), "per-module rank_pattern/alpha_pattern"),
            (c.get("bias", "none") == "none" and not c.get("lora_bias"), "adapter biases (bias / lora_bias)"),
            (not c.get("modules_to_save"), "modules_to_save (full copies of modules)"),
            (not c.get("fan_in_fan_out"), "fan_in_fan_out: true"),
            (isinstance(c.get("r"), int) and c["r"] > 0, f"r {c.get('r')!r}"),
        ]
        for ok, what in checks:
            if not ok:
                raise ConversionError(f"{config_file}: {what} is not supported")
        weights = self.path / WEIGHTS_FILE
        if not weights.is_file():
            other = " (adapter_model.bin is a pickle: save the adapter with safetensors)" \
                if (self.path / "adapter_model.bin").is_file() else ""
            raise ConversionError(f"{weights}: missing{other}")
        try:
            self.file = SafetensorsFile(weights)
        except SafetensorsError as exc:
            raise ConversionError(str(exc)) from None
        self.names = {self._key(n): n for n in self.file.tensors}

    @staticmethod
    def _key(name: str) -> str:
        # Saved without the adapter name; some writers keep it (``lora_A.default.weight``).
        return name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")

    def linears(self) -> tuple[str, ...]:
        """The Megatron linears (``--lora-target-modules``) this adapter's target_modules adapt."""
        targets = self.config.get("target_modules") or []
        if isinstance(targets, str):
            raise ConversionError(f"{self.path / CONFIG_FILE}: a regular expression as target_modules is not "
                                  f"supported; list the modules")
        found = []
        for target in targets:
            short = target.rsplit(".", 1)[-1]
            if short not in HF_TO_LINEAR:
                raise ConversionError(f"{self.path / CONFIG_FILE}: target module {target!r} has no Megatron "
                                      f"linear (choose among {', '.join(HF_ORDER)})")
            if HF_TO_LINEAR[short] not in found:
                found.append(HF_TO_LINEAR[short])
        given = {t.rsplit(".", 1)[-1] for t in targets}
        for linear in found:
            group = {h for h, m in HF_TO_LINEAR.items() if m == linear}
            if not group <= given:
                raise ConversionError(f"{self.path / CONFIG_FILE}: target_modules adapts "
                                      f"{', '.join(sorted(given & group))} but not {', '.join(sorted(group - given))}; "
                                      f"Megatron adapts them as one fused {linear}")
        return tuple(l for l in LINEARS if l in found)

    @property
    def r(self) -> int:
        return int(self.config["r"])

    @property
    def alpha(self) -> float:
        return float(self.config.get("lora_alpha", 8))

    def check_settings(self, settings: LoraSettings) -> None:
        """The flags must build this adapter: same rank and scaling."""
        if settings.r != self.r:
            raise ConversionError(f"{self.path}: r is {self.r} but --lora-r is {settings.r}")
        if not math.isclose(settings.alpha, self.alpha, rel_tol=1e-12):
            raise ConversionError(f"{self.path}: lora_alpha is {_alpha_value(self.alpha)} but --lora-alpha is "
                                  f"{_alpha_value(settings.alpha)}")

    # the HfCheckpoint interface megatron_rank_tensors reads
    def get(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise ConversionError(f"{self.path / WEIGHTS_FILE}: no tensor {name} (the adapter does not adapt "
                                  f"{_module(name)} of this layer; --lora-target-modules asks for it)")
        return self.file.get(self.names[name])

    def get_meta(self, name: str) -> torch.Tensor:
        tensor = self.get(name)
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")

    def release(self, name: str) -> None:
        if name in self.names:
            self.file.release(self.names[name])


def peft_rank_tensors(adapter: PeftAdapter, model_type: str, hf_config: dict, layout: Layout, tp_rank: int,
                      pp_rank: int, ep_rank: int, settings: LoraSettings, wanted: set[str]):
    """(name, tensor) of the lora_A / lora_B tensors rank (tp, pp, ep) holds, from a PEFT adapter.

    `wanted`: the rank's own adapter state names; the adapter must give each exactly, and every
    adapter tensor must have a place on some rank (checked against all params of the model).
    """
    from adaptor.convert.models import model_mapping
    from adaptor.convert.tensors import megatron_rank_tensors

    adapter.check_settings(settings)
    base = model_mapping(model_type, hf_config)
    base.check_layout(layout)
    mapping = lora_mapping(base, settings.targets)
    every = mapping.params(base.vocab_size)
    used = {n for p in every for n in p.hf}
    extra = sorted(n for n in adapter.names if n not in used)
    if extra:
        raise ConversionError(f"{adapter.path / WEIGHTS_FILE}: tensor {extra[0]} adapts a module "
                              f"--lora-target-modules {' '.join(settings.targets)} does not name "
                              f"({len(extra)} such tensors)")

    class _Source:  # adapter tensors, plus the config megatron_rank_tensors asks for
        config = hf_config
        get, get_meta, release = adapter.get, adapter.get_meta, adapter.release

    out = []
    for name, tensor in megatron_rank_tensors(_Source(), mapping, layout, tp_rank, pp_rank, ep_rank,
                                              padded_vocab_size=base.vocab_size):
        if name in wanted:
            out.append((name, tensor))
    got = {n for n, _ in out}
    missing = sorted(wanted - got)
    if missing:
        raise ConversionError(f"{adapter.path}: no value for {missing[0]} (the adapter and the model's LoRA "
                              f"linears differ)")
    return out
