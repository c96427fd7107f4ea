"""Resuming a distributed-optimizer run bit for bit (torch Adam without apex or Transformer Engine; ``torch_dist``).

Without apex or TE, Megatron's distributed optimizer drives torch's Adam, which keeps a ``step``
tensor per parameter, and every ``--use-distributed-optimizer`` resume on CPU (and NPU without apex)
failed:

* ``megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.state_dict`` asserts one step
  value, but during a load there is no state yet; stateless parameters now report ``step = 0`` for
  the call.
* ``DistributedOptimizer.load_state_dict`` gives every parameter the *same* step tensor, which Adam
  increments in place once per parameter, corrupting bias correction; each gets its own copy.

Megatron's default ``torch_dist`` optimizer layout (``dp_reshardable``) has two more faults, on every
backend:

* ``DistributedOptimizer.load_parameter_state_from_dp_reshardable`` copies the loaded state into the
  main parameters with autograd on (its ``fully_reshardable`` and ``fs_model_space`` siblings run
  under ``torch.no_grad``). With fp32 parameters (no ``--bf16``/``--fp16``) a main parameter is a
  view of the model parameter, so every such resume died with "a view of a leaf Variable that
  requires grad is being used in an in-place operation"; it now runs under ``torch.no_grad``. It
  also copies each parameter's ``step`` from the state dict, where ``step`` is not a loaded value but
  the rank's own pre-load one (``sharded_param_state_dp_reshardable`` marks it
  ``LocalNonpersistentObject``: the checkpoint keeps it in ``param_groups``), so torch Adam resumed
  with ``step`` 0 and a wrong bias correction; such entries are now skipped, leaving the step
  ``load_state_dict`` took from ``param_groups``.
* ``DistributedOptimizer.sharded_param_state_dp_reshardable`` saves the gaps between parameters in a
  bucket from ``torch.empty``: whatever bytes the allocator held land in the checkpoint, so two saves
  of the same state differ. The gaps are never read back; they are now saved as zeros, so a
  checkpoint is a function of the training state alone and a resumed run's checkpoints can be
  compared with an uninterrupted run's bit for bit.

Remove when: ``DistributedOptimizer.state_dict`` accepts parameters that have no optimizer state yet
and ``load_state_dict`` gives each parameter its own ``step`` tensor in its no-apex/TE branch (its
HybridDeviceOptimizer branch already clones it), ``load_parameter_state_from_dp_reshardable`` runs
under ``torch.no_grad`` and leaves ``step`` alone, and ``sharded_param_state_dp_reshardable`` fills its padding
deterministically. None is fixed in megatron-core 0.19.2 (distrib_optimizer.py lines 837-839,
1025-1032, 1922 and 2061) nor on Megatron-LM main (d98e8a64, 2026-08-22); no upstream issue or PR
found for them (https://github.com/NVIDIA/Megatron-LM/pull/5898 and
https://github.com/NVIDIA/Megatron-LM/pull/6191 touch the same padding code but keep
``torch.empty``).
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


def _bucket_entries(state: dict):
    """Every parameter or padding entry of a ``dp_reshardable`` state: state[gbuf][dtype][bucket][i]."""
    for key, per_dtype in state.items():
        if isinstance(key, int):
            for buckets in per_dtype.values():
                for bucket in buckets:
                    yield from bucket


def _load_dp_reshardable(wrapped, instance, call_args, kwargs):
    import torch

    state_dict = call_args[0] if call_args else kwargs.get("state_dict")
    for entry in _bucket_entries(state_dict or {}):
        if "step" in entry:
            entry["step"] = None  # not in the checkpoint: this rank's pre-load value
    with torch.no_grad():
        return wrapped(*call_args, **kwargs)


def _sharded_dp_reshardable(wrapped, instance, call_args, kwargs):
    """Zero the padding entries Megatron allocated with ``torch.empty`` (saves only: loads fill them)."""
    from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject, ShardedTensor

    state = wrapped(*call_args, **kwargs)
    if kwargs.get("is_loading", call_args[1] if len(call_args) > 1 else False):
        return state
    for entry in _bucket_entries(state):
        padding = entry.get("padding")
        if isinstance(padding, LocalNonpersistentObject) and padding.obj is True:
            for value in entry.values():
                if isinstance(value, ShardedTensor):
                    value.data.zero_()
    return state


class DistributedOptimizerResume(Feature):
    name = "distributed_optimizer_resume"

    def register_patches(self, pm, ctx) -> None:
        from megatron.core.optimizer import distrib_optimizer

        target = "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer"
        if not distrib_optimizer.HAVE_APEX_OR_TE:
            pm.register_wrapper(f"{target}.state_dict", _state_dict, OWNER)
            pm.register_wrapper(f"{target}.load_state_dict", _load_state_dict, OWNER)
        pm.register_wrapper(f"{target}.load_parameter_state_from_dp_reshardable", _load_dp_reshardable, OWNER)
        pm.register_wrapper(f"{target}.sharded_param_state_dp_reshardable", _sharded_dp_reshardable, OWNER)
