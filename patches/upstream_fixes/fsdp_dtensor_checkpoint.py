"""``--ckpt-format fsdp_dtensor`` (Megatron-FSDP's checkpoint) saves and loads for any model and sharding.

Two upstream faults, both reached before the first checkpoint is written:

* ``megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.sharded_param_state_fsdp_dtensor``
  returns the optimizer state of the parameters this rank holds elements of, in the order they were
  first stepped. Every later step of the save (``handle_swiglu_in_state_dict`` splitting the fused
  SwiGLU weights, ``preprocess_state_dict_for_uneven_dtensor``) runs one collective per state tensor,
  so when a parameter lies wholly in another rank's shard (common for small layers and at bucket
  ends) the ranks disagree on the list and the save hangs. The wrapper gives each parameter without
  state the state its peers have, zero-filled on this rank's empty shard (the step is the common
  step), and orders the state by parameter, the same on every rank. Adam skips a parameter without a
  gradient, so the added entries never step.
* ``megatron.core.transformer.fsdp_dtensor_checkpoint.handle_swiglu_in_state_dict`` and
  ``handle_gdn_in_state_dict`` look each fused weight up with ``model.get_parameter(f"module.{key}")``,
  whose extra ``module.`` is only right when ``Float16Module`` sits inside Megatron-FSDP, under
  ``--bf16``/``--fp16``; an fp32 run fails with ``AttributeError: GPTModel has no attribute `module```.
  For the call, the model's ``get_parameter`` takes the name as given, then without one leading
  ``module.``, then with one more: the name as given first, so bf16 runs look up what they did.

Not fixed, and refused before the run in one line: ``split_swiglu_linear_fc1`` reads each weight's
``megatron_fsdp_slice``, which ``--data-parallel-sharding-strategy no_shard`` does not set, so a SwiGLU
model cannot save ``fsdp_dtensor`` checkpoints unsharded.

Remove when: ``sharded_param_state_fsdp_dtensor`` returns state for every parameter in a rank-independent
order, and both functions look parameters up relative to the state dict. Neither is the case in
megatron-core 0.19.2.
"""
from __future__ import annotations

import torch

from adaptor.features import ArgumentError, Feature

OWNER = __name__
STATE_DICT = "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.sharded_param_state_fsdp_dtensor"
SPLITTERS = "megatron.core.transformer.fsdp_dtensor_checkpoint"
PREFIX = "module."


def _every_parameter_in_order(wrapped, instance, call_args, kwargs):
    state_dict = wrapped(*call_args, **kwargs)  # on load, after upstream's dummy step made the state
    inner = instance.optimizer
    params = [p for group in inner.param_groups for p in group["params"]]
    present = next((inner.state[p] for p in params if inner.state.get(p)), None)
    mine = None if present is None else {
        k: ("like_param", None) if isinstance(v, torch.Tensor) and v.dim() > 0 else
           ("value", v.detach().cpu() if isinstance(v, torch.Tensor) else v)
        for k, v in present.items()}
    templates = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(templates, mine)
    template = next((t for t in templates if t), None)
    for p in params if template is not None else ():
        if not inner.state.get(p):
            inner.state[p] = {k: torch.zeros_like(p) if kind == "like_param" else
                              (v.clone() if isinstance(v, torch.Tensor) else v)
                              for k, (kind, v) in template.items()}
    named = {instance._param_name(p): inner.state[p] for p in params if inner.state.get(p)}
    rest = {k: v for k, v in state_dict["state"].items() if k not in named}
    state_dict["state"] = {**named, **rest}
    return state_dict


def _tolerant_lookup(model):
    exact = model.get_parameter

    def get_parameter(name: str):
        for candidate in (name, name[len(PREFIX):] if name.startswith(PREFIX) else None, PREFIX + name):
            if candidate is None:
                continue
            try:
                return exact(candidate)
            except AttributeError:
                continue
        return exact(name)  # upstream's own error

    return get_parameter


def _any_wrapper_depth(wrapped, instance, call_args, kwargs):
    model = kwargs["model"] if "model" in kwargs else call_args[0]
    model.get_parameter = _tolerant_lookup(model)
    try:
        return wrapped(*call_args, **kwargs)
    finally:
        del model.get_parameter


class FsdpDtensorCheckpoint(Feature):
    name = "fsdp_dtensor_checkpoint"

    def validate(self, args, ctx) -> None:
        if (getattr(args, "use_megatron_fsdp", False) and getattr(args, "ckpt_format", None) == "fsdp_dtensor"
                and getattr(args, "save", None) and getattr(args, "swiglu", False)
                and getattr(args, "data_parallel_sharding_strategy", None) == "no_shard"):
            raise ArgumentError(
                "--data-parallel-sharding-strategy no_shard cannot save a --swiglu model as --ckpt-format "
                "fsdp_dtensor in megatron-core 0.19.2 (its SwiGLU split reads the shard layout no_shard does not "
                "make); use optim, optim_grads or optim_grads_params")

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(STATE_DICT, _every_parameter_in_order, OWNER)
        for function in ("handle_swiglu_in_state_dict", "handle_gdn_in_state_dict"):
            pm.register_wrapper(f"{SPLITTERS}.{function}", _any_wrapper_depth, OWNER)
