"""Which modules of a built model become FSDP2 units, stay replicated, or recompute activations.

Patterns match ``named_modules()`` of the GPT model itself (``decoder.layers.{*}``, not under
``Float16Module``). The root is always a unit holding every parameter no other unit holds. Each rule
is a one-line :class:`Fsdp2ConfigError`: a user's pattern must match something; with tied embeddings
the shared weight may not be in its own unit (it would be resharded before the output layer uses it);
a recompute module may not contain another unit (its hooks would re-run inside the parent's backward).
Modules inside an ignored module are not wrapped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from adaptor.fsdp2.config import Fsdp2Config, Fsdp2ConfigError
from adaptor.fsdp2.patterns import matching


@dataclass
class ShardingPlan:
    units: list[tuple[str, torch.nn.Module]] = field(default_factory=list)  # module order (parents first)
    ignored: list[tuple[str, torch.nn.Module]] = field(default_factory=list)
    ignored_params: list[torch.nn.Parameter] = field(default_factory=list)
    recompute: list[tuple[str, torch.nn.Module]] = field(default_factory=list)


def _inside(name: str, parents) -> bool:
    return any(name == p or name.startswith(p + ".") for p in parents)


def _require_match(key: str, patterns, found, where: str) -> None:
    for pattern in patterns:
        if not any(pattern.matches(name) for name, _ in found):
            raise Fsdp2ConfigError(f"{where}: {key} pattern {pattern.text!r} matches no module of the model "
                                   f"(names look like 'decoder.layers.0', 'embedding', 'output_layer')")


def tied_weight(model: torch.nn.Module):
    """The embedding weight an output layer shares (the model's, or a language model's inside it), or None."""
    for module in model.modules():
        if getattr(module, "share_embeddings_and_output_weights", False) and getattr(module, "pre_process", False):
            return module.shared_embedding_or_output_weight()
    return None


def sharding_plan(model: torch.nn.Module, config: Fsdp2Config) -> ShardingPlan:
    where = config.source
    named = [(name, module) for name, module in model.named_modules() if name]
    plan = ShardingPlan()

    ignored = matching(config.ignored_modules, named)
    _require_match("ignored_modules", config.ignored_modules, ignored, where)
    plan.ignored = ignored
    seen = set()
    for _, module in ignored:
        for param in module.parameters():
            if id(param) not in seen:
                seen.add(id(param))
                plan.ignored_params.append(param)
    ignored_names = [name for name, _ in ignored]

    shared = tied_weight(model)
    patterns, given = config.wrap_patterns(tied_embeddings=shared is not None)
    units = matching(patterns, named)
    if given:
        _require_match("sub_modules_to_wrap", patterns, units, where)
    plan.units = [(name, module) for name, module in units if not _inside(name, ignored_names)]
    if shared is not None and id(shared) not in seen:
        for name, module in plan.units:
            if any(p is shared for p in module.parameters()):
                raise Fsdp2ConfigError(
                    f"{where}: sub_modules_to_wrap makes {name!r} a unit, but it holds the embedding weight the "
                    f"output layer shares (tied embeddings), and a unit releases its weights after its own forward; "
                    f"leave it to the root unit or pass --untie-embeddings-and-output-weights")

    plan.recompute = matching(config.recompute_modules, named)
    _require_match("recompute_modules", config.recompute_modules, plan.recompute, where)
    for name, _ in plan.recompute:
        inner = [unit for unit, _ in plan.units if unit != name and _inside(unit, [name])]
        if inner:
            raise Fsdp2ConfigError(f"{where}: recompute_modules matches {name!r}, which contains the unit "
                                   f"{inner[0]!r}; recompute units or modules inside one")
    return plan
