"""Checkpoints of an FSDP2 model: the upstream code that assumed no DTensor, or even shards.

Enabled with ``--use-torch-fsdp2`` (see :mod:`patches.fsdp2.torch_fsdp2`). Upstream code changed, and why:

* ``megatron.core.dist_checkpointing.optimizer.get_optim_param_to_id_map`` keys parameters by
  ``id(param.to_local())``, a new view each call, so every save failed ("Param id 0 does not match
  any model sharded param"); DTensors are keyed by their ``_local_tensor``.
* ``megatron.core.optimizer.optimizer.FP32Optimizer.load_state_dict`` put plain local shards in
  place of DTensor state, breaking the first Adam step after a resume; they get the parameter's
  mesh and placements.
* ``megatron.training.training.setup_model_and_optimizer`` loads an FSDP2 run's ``torch_dist``
  checkpoint with ``skip_load_to_model_and_opt``: tensors are read in place and
  ``optimizer.load_state_dict`` is never called, so the Adam step count the checkpoint keeps
  (``common_step``, saved once for all parameters) was never restored, and the first step after a
  resume failed with ``KeyError: 'step'``. We take ``common_step`` from the state dict
  ``_load_base_checkpoint`` returns and give each parameter's state its copy after ``load_checkpoint``
  (in place of the 0 that ``patches.checkpoint.optimizer_state_from_start`` created with the state),
  only where the optimizer's state was loaded: ``--finetune`` and ``--no-load-optim`` keep that 0.
  Under ``--fp16`` the same holds for the loss scaler (scale, growth and hysteresis trackers) that
  :class:`adaptor.fsdp2.loss_scaling.LossScaledFP32Optimizer` saves under ``grad_scaler``: it is
  restored from that state dict too, so a resume continues with the scale it stopped at.
* ``megatron.core.utils.make_sharded_tensor_for_checkpoint`` / ``make_tp_sharded_tensor_for_checkpoint``
  assume rows divide evenly over ranks (a 17-row tensor on 2 ranks was refused); the DTensor's true
  offset and row count are used, and a whole tensor is written once.

Remove when: each upstream function handles FSDP2's DTensors itself, and each wrapper can go on its
own: ``get_optim_param_to_id_map`` keys a DTensor by an object that is the same on every call,
``FP32Optimizer.load_state_dict`` restores the state of a DTensor parameter as DTensors, an in-place
``torch_dist`` load restores ``common_step`` (and a loss-scaled optimizer's ``grad_scaler``), and
``make_sharded_tensor_for_checkpoint``/``make_tp_sharded_tensor_for_checkpoint`` use the shard's
real offset and row count. None is fixed upstream as of megatron-core 0.19.2 nor on Megatron-LM main
(d98e8a64, 2026-08-22); no upstream issue or PR found.
"""
from __future__ import annotations

import torch

from adaptor.features import Feature
from adaptor.wrapping import argument

OWNER = __name__


def _optim_param_to_id_map(optim_params_iter) -> dict[int, int]:
    """Optimizer parameter -> its index, keyed by the tensor object the model's checkpoint entries hold."""
    from adaptor.fsdp2.wrapper import local

    mapping: dict[int, int] = {}
    for index, param in enumerate(optim_params_iter):
        mapping.setdefault(id(local(param)), index)
    return mapping


def _dtensor_optimizer_state(wrapped, instance, call_args, kwargs):
    from torch.distributed.tensor import DTensor

    result = wrapped(*call_args, **kwargs)
    for group in instance.optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor):
                continue
            state = instance.optimizer.state.get(param, {})
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) \
                        and value.shape == param._local_tensor.shape:
                    state[key] = DTensor.from_local(value, param.device_mesh, param.placements, run_check=False,
                                                    shape=param.shape, stride=param.stride())
    return result


_loaded: list = []  # (common_step, grad_scaler) of each optimizer in the state dict last loaded


def _loaded_states(optimizer_state) -> list:
    """The ``common_step`` and ``grad_scaler`` of each optimizer in a loaded optimizer state dict, in chain order."""
    if isinstance(optimizer_state, dict) and isinstance(optimizer_state.get("state"), dict):
        return [(optimizer_state["state"].get("common_step"), optimizer_state.get("grad_scaler"))]
    if isinstance(optimizer_state, dict):  # a chain: {0: {...}, 1: {...}}
        return [found for key in sorted(k for k in optimizer_state if isinstance(k, int))
                for found in _loaded_states(optimizer_state[key])]
    return []


def _remember_loaded_state(wrapped, instance, call_args, kwargs):
    result = wrapped(*call_args, **kwargs)
    state_dict = result[0] if isinstance(result, tuple) else None
    _loaded[:] = _loaded_states(state_dict.get("optimizer")) if isinstance(state_dict, dict) else []
    return result


def _optimizer_state_was_loaded() -> bool:
    """Whether ``load_checkpoint`` loaded the optimizer's state, under Megatron's own condition: not with
    ``--finetune`` or ``--no-load-optim``, where the state keeps what the optimizer was built with."""
    from megatron.training import get_args

    args = get_args()
    return not (args.finetune or args.no_load_optim)


def _restore_loaded_state(wrapped, instance, call_args, kwargs):
    _loaded.clear()
    result = wrapped(*call_args, **kwargs)
    optimizer = call_args[1] if len(call_args) > 1 else kwargs.get("optimizer")
    if optimizer is not None and _loaded and _optimizer_state_was_loaded():
        chain = getattr(optimizer, "chained_optimizers", [optimizer])
        for megatron_optimizer, (step, scaler_state) in zip(chain, _loaded):
            if scaler_state is not None and hasattr(megatron_optimizer, "load_grad_scaler"):
                megatron_optimizer.load_grad_scaler(scaler_state)
            inner = getattr(megatron_optimizer, "optimizer", None)
            if step is None or inner is None:
                continue
            for state in inner.state.values():
                if state:  # a step already there is the pre-load one (the state exists from the start)
                    before = state.get("step")
                    like = before if isinstance(before, torch.Tensor) else torch.tensor(0.0)
                    state["step"] = torch.as_tensor(step, dtype=like.dtype, device=like.device).detach().clone()
    _loaded.clear()
    return result


def _true_fsdp2_rows(sh_ten, tensor, tp_axis: int | None, tp_group):
    """A ShardedTensor of an unevenly sharded FSDP2 DTensor, placed where its rows really are."""
    import dataclasses

    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not getattr(sh_ten, "is_torch_fsdp2_param", False) or not isinstance(tensor, DTensor):
        return sh_ten
    rows = tensor.shape[0]
    dp_size = tensor.device_mesh.size()
    whole = sh_ten.local_shape[0] == rows and dp_size > 1  # upstream gathered a tensor with fewer rows than ranks
    if rows % dp_size == 0 and not whole:
        return sh_ten  # even rows: upstream is right
    from megatron.core import parallel_state
    from megatron.core.utils import get_pg_rank, get_pg_size

    group = tp_group if tp_group is not None else parallel_state.get_tensor_model_parallel_group()
    tp_rank, tp_size = get_pg_rank(group), get_pg_size(group)
    replica_id = sh_ten.replica_id
    if whole:  # every rank holds it all: one writes it
        first_row = 0
        replica_id = (*tuple(replica_id)[:2], tensor.device_mesh.get_local_rank())
    else:
        _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
        first_row = offset[0]
    axis = sh_ten.prepend_axis_num
    shape, start = list(sh_ten.global_shape), list(sh_ten.global_offset)
    if tp_axis == 0 and tp_size > 1:
        shape[axis], start[axis] = tp_size * rows, tp_rank * rows + first_row
    else:
        shape[axis], start[axis] = rows, first_row
    fixed = dataclasses.replace(sh_ten, global_shape=tuple(shape), global_offset=tuple(start),
                                axis_fragmentations=None, replica_id=replica_id)
    fixed.is_torch_fsdp2_param = True
    return fixed


def _tp_sharded_tensor(wrapped, instance, call_args, kwargs):
    tensor = argument(call_args, kwargs, "tensor")
    tp_axis = call_args[2] if len(call_args) > 2 else kwargs.get("tp_axis", 0)
    return _true_fsdp2_rows(wrapped(*call_args, **kwargs), tensor, tp_axis, kwargs.get("tp_group"))


def _sharded_tensor(wrapped, instance, call_args, kwargs):
    tensor = argument(call_args, kwargs, "tensor")
    return _true_fsdp2_rows(wrapped(*call_args, **kwargs), tensor, None, kwargs.get("tp_group"))


class ShardedCheckpoint(Feature):
    name = "sharded_checkpoint"
    upstream_flags = ("--use-torch-fsdp2",)

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "use_torch_fsdp2", False))

    def register_patches(self, pm, ctx) -> None:
        pm.register_replacement("megatron.core.dist_checkpointing.optimizer.get_optim_param_to_id_map",
                                _optim_param_to_id_map, OWNER)
        pm.register_wrapper("megatron.core.optimizer.optimizer.FP32Optimizer.load_state_dict",
                            _dtensor_optimizer_state, OWNER)
        pm.register_wrapper("megatron.training.checkpointing._load_base_checkpoint", _remember_loaded_state, OWNER)
        pm.register_wrapper("megatron.training.checkpointing.load_checkpoint", _restore_loaded_state, OWNER)
        pm.register_wrapper("megatron.core.utils.make_tp_sharded_tensor_for_checkpoint", _tp_sharded_tensor, OWNER)
        pm.register_wrapper("megatron.core.utils.make_sharded_tensor_for_checkpoint", _sharded_tensor, OWNER)
