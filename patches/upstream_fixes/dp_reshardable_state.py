"""Save and load a distributed optimizer's default (``dp_reshardable``) state reproducibly.

Upstream, in ``megatron.core.optimizer.distrib_optimizer.DistributedOptimizer``:

* ``load_parameter_state_from_dp_reshardable`` copies each loaded shard into the optimizer's main
  parameter with ``copy_``. Its sibling ``load_parameter_state_from_fs_model_space`` runs under
  ``torch.no_grad()``; this one does not. With bf16 or fp16 the main parameter is a separate fp32
  tensor, but in fp32 it is a view of the model's parameter, which requires grad, so every resume of
  an fp32 ``--use-distributed-optimizer`` run from ``--ckpt-format torch_dist`` ended in "a view of
  a leaf Variable that requires grad is being used in an in-place operation". We run it under
  ``torch.no_grad()``; nothing in it needs a graph.
* The same load copies every state tensor of a bucket entry back, ``step`` too. Without apex or
  TE, torch's Adam keeps a ``step`` per parameter; the checkpoint does not store it there (it is a
  ``LocalNonpersistentObject``, restored from the param groups just before), so the copy put back the
  fresh optimizer's step, 0, and the first step after a resume used the wrong bias correction. We
  drop ``step`` from the entries before the copy.
* ``sharded_param_state_dp_reshardable`` stores the gaps between parameters in a bucket as
  ``torch.empty`` tensors. The loader skips them, but their bytes are whatever memory held, so the
  same run writes different checkpoints and a resumed run's files cannot be compared with an
  uninterrupted run's. We zero those gaps when saving.

Remove when: ``load_parameter_state_from_dp_reshardable`` runs under ``torch.no_grad()`` and skips
``step``, and
``sharded_param_state_dp_reshardable`` fills its padding with zeros; megatron-core 0.19.2 and
Megatron-LM main (d98e8a64, 2026-08-22) do neither (distrib_optimizer.py); no upstream issue or PR
found.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__
_TARGET = "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer"


def _load(wrapped, instance, call_args, kwargs):
    import torch

    state = call_args[0] if call_args else kwargs["state_dict"]
    for gbuf_idx in range(len(instance.gbuf_ranges)):
        for buckets in state[gbuf_idx].values():
            for bucket in buckets:
                for entry in bucket:
                    if "step" in entry:
                        entry["step"] = None  # restored from the param groups; not a tensor to copy
    with torch.no_grad():
        return wrapped(*call_args, **kwargs)


def _zeroed_padding(wrapped, instance, call_args, kwargs):
    from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject, ShardedTensor

    state = wrapped(*call_args, **kwargs)
    is_loading = kwargs.get("is_loading", call_args[1] if len(call_args) > 1 else False)
    if is_loading:
        return state
    for gbuf_idx in range(len(instance.gbuf_ranges)):
        for buckets in state[gbuf_idx].values():
            for bucket in buckets:
                for entry in bucket:
                    padding = entry.get("padding")
                    if isinstance(padding, LocalNonpersistentObject) and padding.obj:
                        for value in entry.values():
                            if isinstance(value, ShardedTensor):
                                value.data.zero_()
    return state


class DpReshardableState(Feature):
    name = "dp_reshardable_state"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(f"{_TARGET}.load_parameter_state_from_dp_reshardable", _load, OWNER)
        pm.register_wrapper(f"{_TARGET}.sharded_param_state_dp_reshardable", _zeroed_padding, OWNER)
