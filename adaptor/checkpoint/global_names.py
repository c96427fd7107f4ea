"""A sharded checkpoint's whole tensors, named as Megatron names them at TP=PP=EP=1, from its shard table.

Each key of a sharded checkpoint is one global tensor; keys whose shards carry prepended axes
(stacked decoder layers, experts) hold one tensor per index along them. Derived from the shard
table alone, without torch: ``tools/safetensors_ckpt.py info`` counts and sizes them in a fraction
of a second, and :class:`adaptor.checkpoint.consolidated.GlobalTensors` assembles them.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from adaptor.checkpoint.shard_table import SavedShard
from adaptor.safetensors_header import ITEMSIZES


@dataclass(frozen=True)
class GlobalTensor:
    name: str
    key: str
    index: tuple[int, ...]  # position along the prepended axes
    shape: tuple[int, ...]
    dtype: str  # torch's name ("bfloat16")

    @property
    def nbytes(self) -> int:
        return ITEMSIZES[self.dtype] * math.prod(self.shape)


def global_name(key: str, index: tuple[int, ...]) -> str:
    """Megatron's TP=PP=EP=1 state-dict name for ``key`` at ``index`` of its prepended axes."""
    name, rest = key, list(index)
    if rest and re.match(r"decoder\.layers\.(?!\d)", name):
        name = name.replace("decoder.layers.", f"decoder.layers.{rest.pop(0)}.", 1)
    if rest and ".experts.experts." in name:
        name = name.replace(".experts.experts.", f".experts.local_experts.{rest.pop(0)}.", 1)
    if rest:
        return f"{key}@{','.join(map(str, index))}"  # a stacking this naming does not know
    return re.sub(r"^mtp\.layers\.(\d+)\.transformer_layer\.", r"mtp.layers.\1.mtp_model_layer.", name)


def global_tensors(shards: dict[str, list[SavedShard]], model_only: bool = True) -> dict[str, GlobalTensor]:
    """Name -> whole tensor, for every key of ``shards`` (a :class:`ShardTable`'s), in key order.

    ``model_only``: leave out the optimizer's state (keys ``optimizer.*``).
    """
    tensors: dict[str, GlobalTensor] = {}
    for key, saved in sorted(shards.items()):
        if model_only and key.startswith("optimizer."):
            continue
        first = saved[0]
        prepend = first.prepend_axis_num
        for index in itertools.product(*(range(n) for n in first.global_shape[:prepend])):
            name = global_name(key, index)
            tensors[name] = GlobalTensor(name, key, index, first.global_shape[prepend:], first.dtype)
    return tensors
