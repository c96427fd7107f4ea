"""Hugging Face vision weights to the towers' parameters and back, whole or one tensor-parallel rank's.

Names on the Hugging Face side are relative to the vision model (``blocks.0.attn.qkv.weight``); a full
checkpoint prefixes them with ``visual.`` (Qwen2.5-VL files) or ``model.visual.`` (Qwen3-VL files and
transformers' in-memory models), which :func:`vision_prefix` finds. What changes besides the names:

* the patch embedding: a ``[hidden, C, T, P, P]`` convolution kernel here is a ``[hidden, C*T*P*P]``
  matrix (same numbers, flattened);
* attention's fused qkv: Hugging Face stacks all queries, then all keys, then all values; megatron
  keeps each head's query, key and value together (one query group per head), so that a column split
  over tensor-parallel ranks hands each rank whole heads;
* Qwen2.5-VL's gated MLP: ``gate_proj`` and ``up_proj`` are megatron's one ``linear_fc1``, gate rows first.
  Split over ranks, each rank holds its slice of the gate rows followed by its slice of the up rows.

Every conversion is a reshape, a permutation or a concatenation, so HF -> tower -> HF is bit-exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from adaptor.mm.qwen_vl.settings import VisionSettings

PREFIXES = ("model.visual.", "visual.", "")


@dataclass(frozen=True)
class Rule:
    ours: str
    hf: tuple[str, ...]
    join: Callable  # HF tensors -> ours
    split: Callable  # ours -> HF tensors
    shard: str  # how TP splits ours: "replicated", "column" (rows), "row" (columns), "glu" (halves by rows)


def _rule(ours, hf, shard="replicated"):
    return Rule(ours, (hf,), lambda t: t, lambda t: (t,), shard)


def _linear(ours, hf, shard, bias=True):
    rules = [_rule(f"{ours}.weight", f"{hf}.weight", shard)]
    if bias:  # a row-parallel layer adds its bias once, after the reduction: every rank holds it whole
        rules.append(_rule(f"{ours}.bias", f"{hf}.bias", "column" if shard == "column" else "replicated"))
    return rules


def _norm(ours, hf, settings):
    names = ("weight",) if settings.family == "qwen2_5_vl" else ("weight", "bias")
    return [_rule(f"{ours}.{n}", f"{hf}.{n}") for n in names]


def _qkv(ours, hf, settings):
    heads, dim = settings.num_heads, settings.head_dim

    def join(t):  # [3 * heads * dim, ...] -> [heads * 3 * dim, ...]
        rest = t.shape[1:]
        return t.reshape(3, heads, dim, *rest).transpose(0, 1).reshape(3 * heads * dim, *rest)

    def split(t):
        rest = t.shape[1:]
        return (t.reshape(heads, 3, dim, *rest).transpose(0, 1).reshape(3 * heads * dim, *rest),)

    return [Rule(f"{ours}.{n}", (f"{hf}.{n}",), join, split, "column") for n in ("weight", "bias")]


def _gated(ours, gate, up):
    def split(t):
        half = t.shape[0] // 2
        return t[:half].clone(), t[half:].clone()

    return [Rule(f"{ours}.{n}", (f"{gate}.{n}", f"{up}.{n}"), lambda g, u: torch.cat([g, u]), split, "glu")
            for n in ("weight", "bias")]


def _patch_embed(settings):
    s = settings
    kernel = (s.hidden_size, s.in_channels, s.temporal_patch_size, s.patch_size, s.patch_size)
    rules = [Rule("patch_embed.weight", ("patch_embed.proj.weight",), lambda t: t.reshape(s.hidden_size, -1),
                  lambda t: (t.reshape(kernel),), "replicated")]
    if s.family == "qwen3_vl":
        rules.append(_rule("patch_embed.bias", "patch_embed.proj.bias"))
    return rules


def _merger(ours, hf, settings):
    if settings.family == "qwen2_5_vl":
        return [*_norm(f"{ours}.norm", f"{hf}.ln_q", settings),
                *_linear(f"{ours}.mlp.linear_fc1", f"{hf}.mlp.0", "column"),
                *_linear(f"{ours}.mlp.linear_fc2", f"{hf}.mlp.2", "row")]
    return [*_norm(f"{ours}.norm", f"{hf}.norm", settings),
            *_linear(f"{ours}.mlp.linear_fc1", f"{hf}.linear_fc1", "column"),
            *_linear(f"{ours}.mlp.linear_fc2", f"{hf}.linear_fc2", "row")]


def rules(settings: VisionSettings) -> list[Rule]:
    """Every parameter of the tower and the Hugging Face tensors it comes from."""
    out = _patch_embed(settings)
    if settings.family == "qwen3_vl":
        out.append(_rule("pos_embed.weight", "pos_embed.weight"))
    for i in range(settings.depth):
        ours, hf = f"layers.{i}", f"blocks.{i}"
        out += _norm(f"{ours}.input_layernorm", f"{hf}.norm1", settings)
        out += _norm(f"{ours}.pre_mlp_layernorm", f"{hf}.norm2", settings)
        out += _qkv(f"{ours}.self_attention.linear_qkv", f"{hf}.attn.qkv", settings)
        out += _linear(f"{ours}.self_attention.linear_proj", f"{hf}.attn.proj", "row")
        if settings.family == "qwen2_5_vl":
            out += _gated(f"{ours}.mlp.linear_fc1", f"{hf}.mlp.gate_proj", f"{hf}.mlp.up_proj")
            out += _linear(f"{ours}.mlp.linear_fc2", f"{hf}.mlp.down_proj", "row")
        else:
            out += _linear(f"{ours}.mlp.linear_fc1", f"{hf}.mlp.linear_fc1", "column")
            out += _linear(f"{ours}.mlp.linear_fc2", f"{hf}.mlp.linear_fc2", "row")
    out += _merger("merger", "merger", settings)
    for k, _ in enumerate(settings.deepstack_visual_indexes):
        out += _merger(f"deepstack_mergers.{k}", f"deepstack_merger_list.{k}", settings)
    return out


def vision_prefix(names) -> str:
    """The prefix of the vision tensors among ``names``: ``model.visual.``, ``visual.`` or none."""
    names = set(names)
    for prefix in PREFIXES:
        if f"{prefix}patch_embed.proj.weight" in names:
            return prefix
    raise ValueError("no vision tower among these tensors (looked for patch_embed.proj.weight under "
                     f"{', '.join(repr(p) for p in PREFIXES if p)} or without a prefix)")


def _shard(tensor: torch.Tensor, kind: str, tp: int, rank: int) -> torch.Tensor:
    if tp == 1 or kind == "replicated":
        return tensor
    if kind == "glu":
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]])
    dim = 0 if kind == "column" else 1
    if tensor.shape[dim] % tp:
        raise ValueError(f"a dimension of {tensor.shape[dim]} does not split over {tp} tensor-parallel ranks")
    return tensor.chunk(tp, dim=dim)[rank]


def from_hf(hf_state: dict, settings: VisionSettings, tp: int = 1, rank: int = 0) -> dict:
    """The tower's state dict (``tp`` ranks: rank ``rank``'s slices) from Hugging Face tensors."""
    prefix = vision_prefix(hf_state)
    out = {}
    for rule in rules(settings):
        names = [prefix + n for n in rule.hf]
        missing = [n for n in names if n not in hf_state]
        if missing:
            raise ValueError(f"the checkpoint lacks {missing[0]} (needed for {rule.ours})")
        out[rule.ours] = _shard(rule.join(*(hf_state[n] for n in names)), rule.shard, tp, rank).contiguous()
    return out


def to_hf(state: dict, settings: VisionSettings, prefix: str = "model.visual.") -> dict:
    """Hugging Face tensors from the tower's whole (TP 1) state dict."""
    out = {}
    for rule in rules(settings):
        if rule.ours not in state:
            raise ValueError(f"the tower's state lacks {rule.ours}")
        for name, tensor in zip(rule.hf, rule.split(state[rule.ours])):
            out[prefix + name] = tensor.contiguous()
    return out


def load_hf(tower: torch.nn.Module, hf_state: dict, tp: int = 1, rank: int = 0) -> None:
    """Copy Hugging Face tensors into ``tower`` (its TP rank's slices); every parameter must receive one."""
    mine = from_hf(hf_state, tower.settings, tp, rank)
    expected = {n for n in tower.state_dict() if not n.endswith("_extra_state")}
    if set(mine) != expected:
        raise ValueError(f"the weight mapping and the tower disagree on {sorted(set(mine) ^ expected)[:3]}")
    tower.load_state_dict(mine, strict=False)
