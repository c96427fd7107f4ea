"""Optimizer state saved with the distributed optimizer, loaded without it (and the reverse).

The tensors of both forms are keyed alike in model space (``optimizer.state.exp_avg.<param key>``,
``optimizer.state.fp32_param.<param key>``), so the reader fills either. What differs is the
small non-tensor part Megatron keeps beside them:

* distributed optimizer: ``{"optimizer": {"param_groups": [...]}, "param_state": ...,
  "param_state_sharding_type": ...}``, Adam's step in every param group;
* Megatron's other optimizers: the torch optimizer's ``{"state": {..., "common_step": step},
  "param_groups": [{..., "params": [...]}]}`` (inside ``"optimizer"`` for mixed precision).

When the checkpoint's form is not the one the loading optimizer asked for, the loading optimizer's
own structure is kept and the checkpoint's hyper-parameters (learning rates, decay, betas, ...)
and step are copied into it, param group by param group, matched as Megatron matches them
(``param_group_identifier_keys``).
"""
from __future__ import annotations

import copy

import torch


def _is_distributed(form: dict) -> bool:
    return "param_state_sharding_type" in form


def _inner(form: dict):
    """The part holding ``param_groups``: the torch optimizer's state dict, or the distributed optimizer's."""
    inner = form.get("optimizer")
    return inner if isinstance(inner, dict) and "param_groups" in inner else form


def _is_form(form) -> bool:
    return isinstance(form, dict) and isinstance(_inner(form).get("param_groups"), list)


def _step(form: dict):
    if _is_distributed(form):
        steps = {g.get("step") for g in _inner(form)["param_groups"]} - {None}
        return next(iter(steps), None)
    step = _inner(form).get("state", {}).get("common_step")
    return step.item() if isinstance(step, torch.Tensor) else step


def _identity(group: dict) -> tuple:
    from megatron.core.optimizer.optimizer import param_group_identifier_keys

    return tuple(group.get(key, group.get(f"pre_{key}")) for key in param_group_identifier_keys)


def _leaves(form) -> list[dict]:
    """The optimizer forms inside ``form``: itself, or those of a chained optimizer (int keys)."""
    if isinstance(form, dict) and form and all(isinstance(k, int) for k in form):
        return [leaf for k in sorted(form) for leaf in _leaves(form[k])]
    return [form] if _is_form(form) else []


def reconcile(saved, requested):
    """``saved`` (the checkpoint's non-tensor optimizer state) in the form ``requested`` has.

    Unchanged when both have the same structure. Otherwise (distributed optimizer switched on or
    off, or a different split into chained optimizers, e.g. expert parameters apart under EP) the
    requested structure is filled with the saved param groups' hyper-parameters and Adam's step.
    """
    saved_leaves, requested_leaves = _leaves(saved), _leaves(requested)
    if not saved_leaves or not requested_leaves:
        return saved
    if len(saved_leaves) == len(requested_leaves) and all(
            _is_distributed(a) == _is_distributed(b) for a, b in zip(saved_leaves, requested_leaves)):
        return saved
    by_identity = {_identity(g): g for leaf in saved_leaves for g in _inner(leaf)["param_groups"]}
    steps = {_step(leaf) for leaf in saved_leaves} - {None}
    if len(steps) > 1:
        raise ValueError(f"the checkpoint's optimizers disagree on Adam's step ({sorted(steps)})")
    out = copy.deepcopy(requested)
    for leaf in _leaves(out):
        for group in _inner(leaf)["param_groups"]:
            source = by_identity.get(_identity(group))
            if source is None:
                raise ValueError(f"the checkpoint has no optimizer param group like {_identity(group)}")
            group.update({k: v for k, v in source.items() if k not in ("params", "step")})
        if not steps:
            continue
        step = float(next(iter(steps)))
        if _is_distributed(leaf):
            for group in _inner(leaf)["param_groups"]:
                group["step"] = step
        else:
            _inner(leaf).setdefault("state", {})["common_step"] = torch.tensor(step)
    return out
