"""SwiGLU's fused ``linear_fc1`` for flattened (distributed-optimizer) shards.

``megatron.core.transformer.mlp.apply_swiglu_sharded_factory`` stores fc1 ``[W; V]`` as two
pieces of one global tensor (all W rows, then all V rows), so the checkpoint does not depend on
TP. Its build function splits the local tensor in half along rows, which is wrong for a
flattened range of that tensor (what the distributed optimizer's model-space layout stores): the
range may lie in W, in V or across both. Here the range is cut at the W/V boundary and each part
becomes a flattened range of its own half-chunk; Megatron's merge (``torch.cat``) joins the
loaded parts back in order.
"""
from __future__ import annotations

import dataclasses
import math

import torch


def with_flat_ranges(factory, original_sh_ten, sharded_offsets, singleton_local_shards: bool = False):
    """Return ``factory`` whose build handles ``flattened_range`` (unchanged otherwise)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    build = factory.build_fn
    axis = len(sharded_offsets)  # fc1's rows, after the prepended (layer, expert) axes
    local_shape = tuple(original_sh_ten.local_shape)
    half_rows = local_shape[0] // 2
    rank_offset = original_sh_ten.global_offset[axis] // local_shape[0]
    frag = original_sh_ten.axis_fragmentations[axis]
    if singleton_local_shards:
        halves = (("_w", (axis, rank_offset, frag)), ("_v", (axis, rank_offset, frag)))
    else:
        halves = (("", (axis, rank_offset, 2 * frag)), ("", (axis, rank_offset + frag, 2 * frag)))
    half_numel = half_rows * math.prod(local_shape[1:])

    def build_fn(key, t, replica_id, flattened_range):
        if flattened_range is None:
            return build(key, t, replica_id, flattened_range)
        start, stop = flattened_range.start, flattened_range.stop
        chunk = torch.empty((half_rows, *local_shape[1:]), dtype=t.dtype, device="meta")
        pieces = []
        for index, (suffix, grid) in enumerate(halves):
            lo = max(start, index * half_numel)
            hi = min(stop, (index + 1) * half_numel)
            if hi <= lo:
                continue
            whole = ShardedTensor.from_rank_offsets(key + suffix, chunk, *sharded_offsets, grid,
                                                    replica_id=replica_id, prepend_axis_num=axis)
            pieces.append(dataclasses.replace(
                whole, data=t[lo - start:hi - start],
                flattened_range=slice(lo - index * half_numel, hi - index * half_numel)))
        return pieces

    factory.build_fn = build_fn
    return factory
