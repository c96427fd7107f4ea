"""Uneven all-gather and reduce-scatter along the first dimension on gloo.

Upstream: ``megatron.core.tensor_parallel.mappings._gather_along_first_dim`` and
``_reduce_scatter_along_first_dim`` with split sizes pass per-rank tensors of different sizes (the
alltoall MoE dispatcher with EP and TP); gloo refuses the uneven all-gather ("ProcessGroupGloo::allgather:
invalid tensor size"). On gloo the gather pads to the largest count and trims, the reduce-scatter
all-reduces and keeps this rank's rows; other backends and even splits run upstream's code.

``megatron.core.optimizer.layer_wise_optimizer.LayerWiseDistributedOptimizer.allgather_params`` (the
layer-wise distributed optimizer's parameter sync without the shard-aligned layout,
``--no-use-layer-wise-param-layout``) all-gathers each rank's flattened parameters, whose sizes differ by
rank. On gloo the wrapper does the same exchange through the padded gather above: each rank's updated
parameters are copied into the other ranks' models.

Remove when: torch's gloo backend accepts uneven ``all_gather`` lists (open:
https://github.com/pytorch/pytorch/issues/156627), or Megatron's uneven paths stop passing lists of
different sizes (they still do in megatron-core 0.19.2 and on Megatron-LM main, d98e8a64,
2026-08-22). The reduce-scatter wrapper is already unneeded with torch 2.14.1, whose gloo
``reduce_scatter`` gives the right rows for uneven lists (checked on two gloo ranks; gloo's
``reduce_scatter`` came with https://github.com/pytorch/pytorch/pull/149869): it can go once every
torch that setup.py allows (torch>=2.6) has it; which release first did is not established here.
"""
from __future__ import annotations

import torch

from adaptor.features import Feature
from adaptor.wrapping import call_arguments

OWNER = __name__
MAPPINGS = "megatron.core.tensor_parallel.mappings"
LAYER_WISE_SYNC = "megatron.core.optimizer.layer_wise_optimizer.LayerWiseDistributedOptimizer.allgather_params"


def _on_gloo(group) -> bool:
    return group is not None and group.size() > 1 and torch.distributed.get_backend(group) == "gloo"


def uneven_all_gather(input_: torch.Tensor, group, sizes: list[int]) -> torch.Tensor:
    """Concatenate each rank's ``input_`` (``sizes[r]`` rows on rank r) along dim 0, with even all_gather."""
    rows = max(sizes)
    padded = input_.new_zeros((rows,) + tuple(input_.shape[1:]))
    padded[: input_.size(0)] = input_
    gathered = [torch.empty_like(padded) for _ in sizes]
    torch.distributed.all_gather(gathered, padded, group=group)
    return torch.cat([g[:n] for g, n in zip(gathered, sizes)])


def uneven_reduce_scatter(input_: torch.Tensor, group, sizes: list[int]) -> torch.Tensor:
    """Sum ``input_`` over ranks and keep this rank's ``sizes[rank]`` rows (its offset is the sum before it)."""
    total = input_.contiguous().clone()
    torch.distributed.all_reduce(total, group=group)
    rank = group.rank()
    start = sum(sizes[:rank])
    return total[start: start + sizes[rank]].contiguous()


def _gather_along_first_dim(wrapped, instance, call_args, kwargs):
    a = call_arguments(wrapped, call_args, kwargs)
    sizes = a.get("output_split_sizes")
    if sizes is None or not _on_gloo(a["group"]):
        return wrapped(*call_args, **kwargs)
    return uneven_all_gather(a["input_"], a["group"], [int(s) for s in sizes])


def _reduce_scatter_along_first_dim(wrapped, instance, call_args, kwargs):
    a = call_arguments(wrapped, call_args, kwargs)
    sizes = a.get("input_split_sizes")
    if sizes is None or not _on_gloo(a["group"]):
        return wrapped(*call_args, **kwargs)
    return uneven_reduce_scatter(a["input_"], a["group"], [int(s) for s in sizes])


@torch.no_grad()
def _gather_params_of_every_rank(params_by_rank: list, group) -> None:
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    rank = group.rank()
    sizes = [sum(p.numel() for p in params) for params in params_by_rank]
    if max(sizes) == 0:
        return
    reference = next(p for params in params_by_rank for p in params)
    local = params_by_rank[rank]
    flat = _flatten_dense_tensors(local) if local else reference.new_empty(0)
    gathered = uneven_all_gather(flat, group, sizes)
    start = 0
    for r, params in enumerate(params_by_rank):
        if params and r != rank:
            for updated, param in zip(_unflatten_dense_tensors(gathered[start:start + sizes[r]], params), params):
                param.data.copy_(updated)
        start += sizes[r]


def _layer_wise_allgather_params(wrapped, instance, call_args, kwargs):
    groups = [(getattr(instance, "dp_cp_params_list", None), instance.dp_cp),
              (getattr(instance, "expt_dp_params_list", None), instance.expt_dp)]
    if instance.pg_collection is None or not any(lists and _on_gloo(group) for lists, group in groups):
        return wrapped(*call_args, **kwargs)
    for lists, group in groups:
        if lists:
            _gather_params_of_every_rank(lists, group)
    return None


class GlooUnevenCollectives(Feature):
    name = "gloo_uneven_collectives"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(f"{MAPPINGS}._gather_along_first_dim", _gather_along_first_dim, OWNER)
        pm.register_wrapper(f"{MAPPINGS}._reduce_scatter_along_first_dim", _reduce_scatter_along_first_dim, OWNER)
        pm.register_wrapper(LAYER_WISE_SYNC, _layer_wise_allgather_params, OWNER)
