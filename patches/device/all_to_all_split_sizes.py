"""Expert-parallel all-to-all off CUDA: split sizes as lists of ints, output on the input's device.

Upstream: ``megatron.core.tensor_parallel.mappings._AllToAll.forward`` (used by the alltoall MoE
dispatcher with EP > 1) passes split sizes straight to ``torch.distributed.all_to_all_single``; the
dispatcher converts them to numpy only for CUDA tensors (``moe_utils.maybe_move_tensor_to_cpu``), so
on CPU and NPU they arrive as tensors, which it refuses, and the output is allocated on
``torch.cuda.current_device()``. The replacement forward converts sizes to int lists (reused by the
unchanged backward) and allocates on the input's device; CUDA keeps upstream's code.

Remove when: ``_AllToAll.forward`` allocates its output on the input's device and the dispatcher
hands it split sizes as lists or arrays whatever device they were computed on
(``moe_utils.maybe_move_tensor_to_cpu`` converts only ``is_cuda`` tensors). Not fixed upstream as of
megatron-core 0.19.2 (mappings.py line 447, moe_utils.py line 1184) nor on Megatron-LM main
(d98e8a64, 2026-08-22); no upstream issue or PR found.
"""
from __future__ import annotations

import torch

from adaptor.features import Feature

OWNER = __name__


def split_sizes_as_ints(sizes):
    """None, a tensor, a numpy array or a sequence of numbers -> None or a list of ints."""
    if sizes is None:
        return None
    if hasattr(sizes, "tolist"):
        sizes = sizes.tolist()
    return [int(s) for s in sizes]


def _all_to_all_forward(ctx, group, input, output_split_sizes, input_split_sizes, use_nccl_stream=False):
    output_split_sizes = split_sizes_as_ints(output_split_sizes)
    input_split_sizes = split_sizes_as_ints(input_split_sizes)
    ctx.group = group
    ctx.output_split_sizes = output_split_sizes
    ctx.input_split_sizes = input_split_sizes
    ctx.use_nccl_stream = use_nccl_stream
    if group.size() == 1:
        return input
    input = input.contiguous()
    if output_split_sizes is None:
        output = torch.empty_like(input)
    else:
        output = input.new_empty(size=[sum(output_split_sizes)] + list(input.size()[1:]))
    torch.distributed.all_to_all_single(
        output, input, output_split_sizes=output_split_sizes, input_split_sizes=input_split_sizes, group=group,
    )
    return output


class AllToAllSplitSizes(Feature):
    name = "all_to_all_split_sizes"
    backends = ("npu", "cpu")

    def register_patches(self, pm, ctx) -> None:
        pm.register_replacement("megatron.core.tensor_parallel.mappings._AllToAll.forward",
                                staticmethod(_all_to_all_forward), OWNER)
