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


def reconcile(saved, requested):
    """``saved`` (the checkpoint's non-tensor optimizer state) in the form ``requested`` has."""
    if not isinstance(saved, dict) or not isinstance(requested, dict):
        return saved
    if saved and all(isinstance(k, int) for k in saved) and saved.keys() == requested.keys():
        return {k: reconcile(saved[k], requested[k]) for k in saved}  # a chained optimizer
    if not (_is_form(saved) and _is_form(requested)) or _is_distributed(saved) == _is_distributed(requested):
        return saved
    out = copy.deepcopy(requested)
    by_identity = {_identity(g): g for g in _inner(saved)["param_groups"]}
    for group in _inner(out)["param_groups"]:
        source = by_identity.get(_identity(group))
        if source is None:
            raise ValueError(f"the checkpoint has no optimizer param group like {_identity(group)}")
        group.update({k: v for k, v in source.items() if k not in ("params", "step")})
    step = _step(saved)
    if step is not None:
        if _is_distributed(out):
            for group in _inner(out)["param_groups"]:
                group["step"] = float(step)
        else:
            _inner(out).setdefault("state", {})["common_step"] = torch.tensor(float(step))
    return out
