"""Adam's state exists from the moment the optimizer is built, so a checkpoint can be saved before its first step.

Upstream: ``megatron.core.optimizer._get_megatron_optimizer_based_on_param_groups`` (and
``_get_megatron_emerging_optimizer``, which builds Muon's chained optimizer with an Adam part) return
wrappers around ``torch.optim.Adam``/``AdamW`` when Transformer Engine and apex are missing. torch
creates a parameter's ``step``, ``exp_avg`` and ``exp_avg_sq`` lazily, in ``Adam._init_group`` at its
first ``step``. Megatron's checkpoint code reads them unconditionally: a save before the optimizer has
stepped (fp16's loss-scale warm-up skips the first iterations, ``--save-interval 1`` with an fp16
run, a SIGTERM under ``--exit-signal-handler`` before a step was taken) ended in ``KeyError:
'exp_avg'`` in ``DistributedOptimizer.get_parameter_state_dp_zero``
(``--dist-ckpt-optim-fully-reshardable``), and other layouts wrote checkpoints whose optimizer part
the resume could not match.

The patch wraps both builders and, for every parameter of every torch Adam/AdamW inside the returned
optimizer (chained or not, the host-offloading one included), creates the state exactly as
``_init_group`` would on the first step, under the group's flags as they are then (after
``patches.fusions.fused_adam`` switched the group to the fused kernel): ``step`` a 0-d zero tensor
(float32 on the parameter's device for fused or capturable groups, else ``torch.tensor(0.0)`` of
torch's scalar dtype on the CPU), ``exp_avg`` and ``exp_avg_sq`` ``zeros_like`` the parameter, and
``max_exp_avg_sq`` with ``amsgrad``. ``_init_group`` skips a parameter whose state is not empty, so
the first real step reads these tensors and computes bit for bit what it computes from its own; a
parameter that never gets a gradient keeps zero state and is never stepped, as before. A parameter
with no elements on this rank (a Megatron-FSDP shard that lies wholly on other ranks) is left without
state, as Megatron's own ``_init_optimizer_states_with_dummy_values`` leaves it: it never gets a
gradient there, and a step of 0 of its own would be saved as its step for every rank
(``patches.upstream_fixes.fsdp_dtensor_checkpoint`` gives such parameters their peers' state). The offloading
optimizer's host-stepped parameters get their state on the host, where it would have moved at the first
step. Memory: the same tensors the first step allocates, earlier (before any activation), so the peak
is unchanged.

One more upstream fault shows with that state: ``Float16OptimizerWithFloat16Params.sharded_state_dict``
and ``FP32Optimizer.sharded_state_dict`` (megatron.core.optimizer.optimizer) keep Adam's per-parameter
``step`` aside as ``common_step`` only ``if step:``, so a step of 0 was dropped and the resume's
``torch.optim.Adam.load_state_dict`` failed with ``KeyError: 'step'``. A step that is there but 0 is
now kept as ``common_step`` too (what a step of 1 or more always was).

Remove when: Megatron's checkpoint code accepts parameters without optimizer state (or initialises
it, as its ``init_state_fn`` does on load only) for every layout: not in megatron-core 0.19.2
(``get_parameter_state_dp_zero``, distrib_optimizer.py line 1354, indexes ``exp_avg`` directly) nor on
Megatron-LM main (d98e8a64, 2026-08-22); and the two ``sharded_state_dict`` test ``step is not None``
(optimizer.py lines 1187 and 1376 in 0.19.2).
"""
from __future__ import annotations

import torch

from adaptor.features import Feature

OWNER = __name__
BUILDERS = ("megatron.core.optimizer._get_megatron_optimizer_based_on_param_groups",
            "megatron.core.optimizer._get_megatron_emerging_optimizer")


def _torch_adams(optimizer):
    """The torch Adam/AdamW optimizers inside a Megatron optimizer (chained or not)."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", opt)
        if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            yield inner


def _host_params(optimizer) -> set:
    """The parameters a host-offloading Adam steps on the host (their state lives there)."""
    offloaded = getattr(optimizer, "offloaded_params", None)
    return set(offloaded()) if offloaded is not None else set()


def _no_local_elements(p) -> bool:
    local = getattr(p, "_local_tensor", p)
    return p.numel() == 0 or local.numel() == 0


def initialise_state(optimizer: torch.optim.Optimizer) -> int:
    """Give every parameter of a torch Adam/AdamW the state its first step would create; returns how many got it."""
    from torch.optim.optimizer import _get_scalar_dtype

    on_host = _host_params(optimizer)
    created = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if len(state) != 0:  # loaded or already stepped: torch's lazy init would leave it alone too
                continue
            if _no_local_elements(p):  # nothing to hold; left to the paths that handle stateless shards
                continue
            device = torch.device("cpu") if p in on_host else p.device
            if group.get("capturable") or group.get("fused"):
                state["step"] = torch.zeros((), dtype=_get_scalar_dtype(is_fused=group.get("fused")), device=device)
            else:
                state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
            for key in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group.get("amsgrad") else ()):
                state[key] = (torch.zeros_like(p, memory_format=torch.preserve_format) if device == p.device
                              else torch.zeros(p.shape, dtype=p.dtype, device=device))
            created += 1
    return created


def _state_after_build(wrapped, instance, call_args, kwargs):
    optimizer = wrapped(*call_args, **kwargs)
    for inner in _torch_adams(optimizer):
        initialise_state(inner)
    return optimizer


def _zero_step_kept(wrapped, instance, call_args, kwargs):
    """``common_step`` in the sharded state dict whenever the torch state has a step, 0 included."""
    sharded = wrapped(*call_args, **kwargs)
    state = (sharded["optimizer"] if "optimizer" in sharded else sharded).get("state")
    if not isinstance(state, dict) or "common_step" in state:
        return sharded
    steps = [s["step"] for s in instance.optimizer.state.values() if "step" in s]
    if steps and all(float(step) == 0 for step in steps):
        state["common_step"] = steps[0].clone() if torch.is_tensor(steps[0]) else steps[0]
    return sharded


class OptimizerStateFromStart(Feature):
    name = "optimizer_state_from_start"

    def register_patches(self, pm, ctx) -> None:
        for target in BUILDERS:
            pm.register_wrapper(target, _state_after_build, OWNER)
        for cls in ("Float16OptimizerWithFloat16Params", "FP32Optimizer"):
            pm.register_wrapper(f"megatron.core.optimizer.optimizer.{cls}.sharded_state_dict", _zero_step_kept, OWNER)
