"""Sharding checks that also understand flattened shards (distributed-optimizer state in model space).

megatron-core 0.19.2 checks that every chunk of every global tensor is held by exactly one
main replica. Our distributed-optimizer layout (``fully_sharded_model_space``) stores each data-
parallel rank's contiguous *range* of a chunk, so one chunk has several holders; for those keys
we check instead that the ranges tile the chunk exactly, and leave every other key to Megatron.
"""
from __future__ import annotations

import math
from collections import defaultdict

from adaptor.checkpoint.errors import CheckpointError


def _is_flat(item) -> bool:
    return getattr(item, "flattened_range", None) is not None


def validate_sharding(global_metadata) -> None:
    """Rank 0 checks the shards every rank holds (``global_metadata[rank]``) cover each tensor once."""
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.mapping import is_main_replica
    from megatron.core.dist_checkpointing.validation import validate_sharding_integrity

    flat_keys = {item.key for rank_items in global_metadata for item in rank_items if _is_flat(item)}
    validate_sharding_integrity([[item for item in rank_items if item.key not in flat_keys]
                                 for rank_items in global_metadata])
    if dist.get_rank() != 0 or not flat_keys:
        return
    chunks: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for rank_items in global_metadata:
        for item in rank_items:
            if item.key in flat_keys and is_main_replica(item.replica_id):
                if not _is_flat(item):
                    raise CheckpointError(f"tensor {item.key} is stored both whole and in flattened ranges")
                chunk = (item.key, tuple(item.global_offset), tuple(item.local_shape))
                chunks[chunk].append((item.flattened_range.start, item.flattened_range.stop))
    for (key, offset, shape), ranges in chunks.items():
        position = 0
        for start, stop in sorted(ranges):
            if start != position:
                raise CheckpointError(f"tensor {key} chunk at {list(offset)}: flattened ranges "
                                      f"{'overlap' if start < position else 'leave a gap'} at element {min(start, position)}")
            position = stop
        if position != math.prod(shape):
            raise CheckpointError(f"tensor {key} chunk at {list(offset)}: flattened ranges end at {position} "
                                  f"of {math.prod(shape)} elements")


def validate_flat_metadata(validate, sh_ten) -> None:
    """ShardedTensor.validate_metadata_integrity for a flattened shard: the checks on the chunk, plus the range."""
    flat, data = sh_ten.flattened_range, sh_ten.data
    sh_ten.flattened_range, sh_ten.data = None, None
    try:
        validate()
    finally:
        sh_ten.flattened_range, sh_ten.data = flat, data
    numel = math.prod(sh_ten.local_shape)
    if flat.step not in (None, 1) or not 0 <= flat.start <= flat.stop <= numel:
        raise CheckpointError(f"tensor {sh_ten.key}: flattened range {flat} outside its {numel}-element chunk")
    if data is not None and (data.dim() != 1 or data.numel() != flat.stop - flat.start or data.dtype != sh_ten.dtype):
        raise CheckpointError(f"tensor {sh_ten.key}: flattened data {list(data.shape)} {data.dtype} does not match "
                              f"range {flat.start}:{flat.stop} {sh_ten.dtype}")
