"""A sharded checkpoint seen as whole tensors, and written out as one Hub-style directory.

Each key of a sharded checkpoint is one global tensor; keys whose shards carry prepended axes
(stacked decoder layers, experts) hold one tensor per index along them. :class:`GlobalTensors`
names every such tensor by the name Megatron's own ``state_dict()`` gives it at TP=PP=EP=1
(``decoder.layers.3.mlp.experts.local_experts.1.linear_fc1.weight``) and assembles it from
whichever rank files hold its pieces. :func:`merge` writes the model part as
``model-0000x-of-0000N.safetensors`` + ``model.safetensors.index.json`` with those names, or with
Hugging Face names for the architectures :mod:`adaptor.convert` maps, plus
``megatron_checkpoint.json`` (iteration, arguments, name -> key/index) so the directory can be
split into a parallel layout again.
"""
from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from adaptor.checkpoint import files
from adaptor.checkpoint.errors import CheckpointError
from adaptor.checkpoint.reader import CheckpointIndex

SIDE_FILE = "megatron_checkpoint.json"
TRACKER = "latest_checkpointed_iteration.txt"


@dataclass(frozen=True)
class GlobalTensor:
    name: str
    key: str
    index: tuple[int, ...]  # position along the prepended axes
    shape: tuple[int, ...]
    dtype: torch.dtype


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


def resolve(path) -> Path:
    """A checkpoint directory from ``path``: an iteration directory, or a --save directory with a tracker."""
    path = Path(path)
    if files.is_safetensors_checkpoint(path):
        return path
    tracker = path / TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        name = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else None
        if name is None:
            raise CheckpointError(f"{tracker}: does not name an iteration ({text!r})")
        if files.is_safetensors_checkpoint(path / name):
            return path / name
        raise CheckpointError(f"{path / name}: not a safetensors checkpoint (named by {tracker})")
    raise CheckpointError(f"{path}: neither a safetensors checkpoint nor a --save directory with {TRACKER}")


class GlobalTensors:
    """Whole tensors of one checkpoint, by name; each assembled on request from the rank files."""

    def __init__(self, checkpoint_dir, model_only: bool = True):
        self.index = CheckpointIndex(resolve(checkpoint_dir))
        self.tensors: dict[str, GlobalTensor] = {}
        for key, shards in sorted(self.index.shards.items()):
            if model_only and key.startswith("optimizer."):
                continue
            first = shards[0]
            prepend = first.prepend_axis_num
            for index in itertools.product(*(range(n) for n in first.global_shape[:prepend])):
                name = global_name(key, index)
                self.tensors[name] = GlobalTensor(name, key, index, first.global_shape[prepend:], first.dtype)

    def request(self, name: str):
        """A ShardedTensor asking for the whole tensor ``name`` (what a TP=PP=EP=1 rank would hold)."""
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        t = self.tensors[name]
        global_shape = (*self.index.shards[t.key][0].global_shape,)
        return ShardedTensor(t.key, None, t.dtype, t.shape, global_shape, (*t.index, *(0,) * len(t.shape)),
                             None, prepend_axis_num=len(t.index))

    def get(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise CheckpointError(f"{self.index.dir}: no tensor {name}")
        return self.index.load_tensor(self.request(name))

    def meta(self, name: str) -> torch.Tensor:
        t = self.tensors[name]
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    def common_state(self) -> dict:
        return self.index.common_state()
