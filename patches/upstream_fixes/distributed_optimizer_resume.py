"""Resuming a distributed-optimizer run without apex or Transformer Engine.

Without apex or TE, Megatron's distributed optimizer drives torch's Adam, which keeps a ``step``
tensor per parameter, and every ``--use-distributed-optimizer`` resume on CPU (and NPU without apex)
failed:

* ``megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.state_dict`` asserts one step
  value, but during a load there is no state yet; stateless parameters now report ``step = 0`` for
  the call.
* ``DistributedOptimizer.load_state_dict`` gives every parameter the *same* step tensor, which Adam
  increments in place once per parameter, corrupting bias correction; each gets its own copy.

Remove when: ``DistributedOptimizer.state_dict`` accepts parameters that have no optimizer state yet
and ``load_state_dict`` gives each parameter its own ``step`` tensor in its no-apex/TE branch (its
HybridDeviceOptimizer branch already clones it). Not fixed upstream as of megatron-core 0.19.2
(distrib_optimizer.py lines 837-839 and 1025-1032) nor on Megatron-LM main (d98e8a64, 2026-08-22);
no upstream issue or PR found.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__


def _state_dict(wrapped, instance, call_args, kwargs):
    inner = instance.optimizer
    if any("step" in state for state in inner.state.values()):
        return wrapped(*call_args, **kwargs)
    import torch

    added = []
    for group in inner.param_groups:
        for param in group["params"]:
            if "step" not in inner.state[param]:
                inner.state[param]["step"] = torch.tensor(0.0)
                added.append(param)
    try:
        return wrapped(*call_args, **kwargs)
    finally:
        for param in added:
            del inner.state[param]["step"]
            if not inner.state[param]:
                del inner.state[param]


def _load_state_dict(wrapped, instance, call_args, kwargs):
    import torch

    result = wrapped(*call_args, **kwargs)
    seen = set()
    for state in instance.optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            if id(step) in seen:
                state["step"] = step.clone()
            seen.add(id(step))
    return result


class DistributedOptimizerResume(Feature):
    name = "distributed_optimizer_resume"

    def enabled(self, ctx) -> bool:
        from megatron.core.optimizer import distrib_optimizer

        return super().enabled(ctx) and not distrib_optimizer.HAVE_APEX_OR_TE

    def register_patches(self, pm, ctx) -> None:
        target = "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer"
        pm.register_wrapper(f"{target}.state_dict", _state_dict, OWNER)
        pm.register_wrapper(f"{target}.load_state_dict", _load_state_dict, OWNER)
