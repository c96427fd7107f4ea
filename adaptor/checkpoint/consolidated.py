"""A sharded checkpoint seen as whole tensors, and written out as one Hub-style directory.

:class:`GlobalTensors` assembles each whole tensor of a checkpoint, named as Megatron's own
``state_dict()`` names it at TP=PP=EP=1 (``decoder.layers.3.mlp.experts.local_experts.1.linear_fc1.weight``;
:mod:`adaptor.checkpoint.global_names`), from whichever rank files hold its pieces. :func:`merge`
writes the model part as ``model-0000x-of-0000N.safetensors`` + ``model.safetensors.index.json``
with those names, plus ``megatron_checkpoint.json`` (iteration, arguments, name -> key/index) so
the directory can be split into a parallel layout again (:func:`to_release`). Hugging Face names
are the conversion library's business (:func:`adaptor.convert.offline.merge_to_hf`), which builds
on this module, never the reverse.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Iterable

import torch

from adaptor.checkpoint import files
from adaptor.checkpoint.errors import CheckpointError
from adaptor.checkpoint.global_names import GlobalTensor, global_tensors
from adaptor.checkpoint.object_codec import dtype_from_name
from adaptor.checkpoint.reader import CheckpointIndex
from adaptor.checkpoint.consolidated_dirs import SIDE_FILE, read_side_file, resolve
from adaptor.safetensors_file import SafetensorsError, SafetensorsFile, write_file

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class GlobalTensors:
    """Whole tensors of one checkpoint, by name; each assembled on request from the rank files."""

    def __init__(self, checkpoint_dir, model_only: bool = True):
        self.index = CheckpointIndex(resolve(checkpoint_dir))
        self.tensors: dict[str, GlobalTensor] = global_tensors(self.index.shards, model_only)

    def request(self, name: str):
        """A ShardedTensor asking for the whole tensor ``name`` (what a TP=PP=EP=1 rank would hold)."""
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        t = self.tensors[name]
        global_shape = (*self.index.shards[t.key][0].global_shape,)
        return ShardedTensor(t.key, None, dtype_from_name(t.dtype), t.shape, global_shape,
                             (*t.index, *(0,) * len(t.shape)), None, prepend_axis_num=len(t.index))

    def get(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise CheckpointError(f"{self.index.dir}: no tensor {name}")
        return self.index.load_tensor(self.request(name))

    def meta(self, name: str) -> torch.Tensor:
        t = self.tensors[name]
        return torch.empty(t.shape, dtype=dtype_from_name(t.dtype), device="meta")

    def common_state(self) -> dict:
        return self.index.common_state()


# -------------------------------------------------------------------------------- Hub-style directories
# One model.safetensors, or model-0000i-of-0000N.safetensors + model.safetensors.index.json: what merge
# writes (adaptor.convert.hf_writer too, with Hugging Face names) and split reads.
def plan_shards(specs: list[tuple[str, torch.Tensor]], max_shard_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    shards: list[list] = [[]]
    filled = 0
    for name, meta in specs:
        nbytes = meta.numel() * meta.element_size()
        if shards[-1] and filled + nbytes > max_shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append((name, meta))
        filled += nbytes
    return shards


def write_shards(save_dir, specs: list[tuple[str, torch.Tensor]], tensors: Iterable[tuple[str, torch.Tensor]],
                 max_shard_bytes: int = 5 * 2**30) -> list[str]:
    """Write ``tensors`` into ``save_dir`` as the Hub does, one tensor in memory at a time.

    ``specs`` gives every (name, meta tensor) in the order ``tensors`` will yield them, so each
    shard's header is written before its data. Returns the file names.
    """
    save_dir = Path(save_dir)
    shards = plan_shards(specs, max_shard_bytes)
    count = len(shards)
    names = [SINGLE_FILE] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    source = iter(tensors)
    for file_name, shard in zip(names, shards):
        write_file(save_dir / file_name, itertools.islice(source, len(shard)), specs=shard)
    leftover = next(source, None)
    if leftover is not None:
        raise SafetensorsError(f"internal: tensor {leftover[0]} was not planned")
    if count > 1:
        weight_map = {name: file_name for file_name, shard in zip(names, shards) for name, _ in shard}
        total = sum(meta.numel() * meta.element_size() for _, meta in specs)
        (save_dir / INDEX_FILE).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return names


class ShardedTensors:
    """The tensors of a Hub-style directory, by name.

    Headers of every file are read and checked when it is opened (missing shards, truncated files,
    names the index lists but the shard lacks); data is memory-mapped and returned without copying.
    ``error``: the exception raised; ``confined``: shard names must be files of the directory itself
    (:class:`adaptor.convert.hf_directory.HfCheckpoint` raises its own, and follows the links of a
    Hugging Face cache's snapshot directories).
    """

    error, confined = CheckpointError, True

    def __init__(self, path):
        self.path = Path(path)
        index_file = self.path / INDEX_FILE
        if index_file.is_file():
            try:
                weight_map: dict[str, str] = json.loads(index_file.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise self.error(f"{index_file}: not a safetensors index ({exc})") from exc
        elif (self.path / SINGLE_FILE).is_file():
            weight_map = None
        else:
            raise self.error(f"{self.path}: no {SINGLE_FILE} and no {INDEX_FILE}")
        self._files: dict[str, SafetensorsFile] = {}
        if weight_map is None:
            file = self._open(SINGLE_FILE, None)
            self._where = {name: file for name in file.tensors}
            return
        self._where: dict[str, SafetensorsFile] = {}
        for name, file_name in weight_map.items():
            file = self._open(file_name, name)
            if name not in file.tensors:
                raise self.error(f"{file.path}: tensor {name} listed in {INDEX_FILE} is not in this file")
            self._where[name] = file

    def _open(self, file_name: str, first_tensor: str | None) -> SafetensorsFile:
        if file_name not in self._files:
            file_path = files.member(self.path, file_name) if self.confined else self.path / file_name
            if not file_path.is_file():
                raise self.error(f"{file_path}: missing shard (holds tensor {first_tensor} according to {INDEX_FILE})")
            try:
                self._files[file_name] = SafetensorsFile(file_path)
            except SafetensorsError as exc:
                raise self.error(str(exc)) from None
        return self._files[file_name]

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def _file(self, name: str) -> SafetensorsFile:
        if name not in self._where:
            raise self.error(f"{self.path}: tensor {name} not found in the checkpoint")
        return self._where[name]

    def get(self, name: str) -> torch.Tensor:
        """The tensor, memory-mapped (no copy)."""
        return self._file(name).get(name)

    def get_meta(self, name: str) -> torch.Tensor:
        dtype, shape, _, _ = self._file(name).tensors[name]
        return torch.empty(shape, dtype=dtype, device="meta")

    def release(self, name: str) -> None:
        """After a tensor was used: give its memory-mapped pages back (unchanged pages, re-read on demand)."""
        self._file(name).release(name)


# -------------------------------------------------------------------------------- merge
# The local spec stores layer norms under TE's fused names in checkpoints (Megatron's
# sharded_state_dict_keys_map); adaptor.convert's mappings use the module names.
_FUSED_NORMS = (("self_attention.linear_qkv.layer_norm_", "input_layernorm."),
                ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."))


def module_name(name: str) -> str:
    """A checkpoint tensor's name with the module names the local spec uses (``input_layernorm``)."""
    for fused, module in _FUSED_NORMS:
        name = name.replace(fused, module)
    return name


def merge(load, save_dir, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write the model of a sharded checkpoint as whole tensors under Megatron's names (Hugging Face
    names: :func:`adaptor.convert.offline.merge_to_hf`, which reads :class:`GlobalTensors` too)."""
    source = GlobalTensors(load)
    try:
        names = list(source.tensors)
        with files.staged_directory(save_dir) as temp:
            write_shards(temp, [(n, source.meta(n)) for n in names], ((n, source.get(n)) for n in names),
                         max_shard_bytes)
            (temp / SIDE_FILE).write_text(merged_description(source))
    finally:
        source.index.close()
    return Path(save_dir)


def merged_description(source: GlobalTensors, model_type_hf: str | None = None) -> str:
    """``megatron_checkpoint.json`` of a merged directory: where it came from, and each tensor's key and
    index in the sharded checkpoint (what split needs to write one again)."""
    return json.dumps({
        "format": files.FORMAT_NAME, "source": str(source.index.dir),
        "iteration": source.common_state().get("iteration"), "names": "hf" if model_type_hf else "megatron",
        "model_type_hf": model_type_hf,
        "command_line": source.index.doc.get("command_line"), "parallel": source.index.doc.get("parallel"),
        "tensors": {t.name: {"key": t.key, "index": list(t.index)} for t in source.tensors.values()}}, indent=1) + "\n"


# -------------------------------------------------------------------------------- split
def write_whole_release(release, specs, where: dict, tensors, source: str, command_line=None) -> None:
    """A weights-only checkpoint of whole tensors at ``release``: one rank file, which Megatron reshards
    on load at any layout. ``specs``: (name, meta tensor) in the order ``tensors`` yields them (one at a
    time); ``where``: name -> (checkpoint key, index on the key's prepended axes: stacked layers, experts)."""
    from adaptor.checkpoint.writer import rank_metadata

    counts: dict[str, list[int]] = {}
    for key, index in where.values():
        grown = counts.setdefault(key, [0] * len(index))
        counts[key] = [max(c, i + 1) for c, i in zip(grown, index)]
    shards = [{"name": name, "key": key, "dtype": str(meta.dtype).removeprefix("torch."),
               "global_shape": counts[key] + list(meta.shape), "global_offset": list(index) + [0] * meta.dim(),
               "local_shape": list(meta.shape), "prepend_axis_num": len(index), "flattened_range": None}
              for name, meta in specs for key, index in [where[name]]]
    staging = files.prepare_staging(release)
    write_file(staging / files.rank_file(0), tensors, rank_metadata(0, shards, {}), specs=specs)
    files.write_json(staging / files.COMMON_JSON, {
        "format": files.FORMAT_NAME, "version": files.BACKEND_VERSION, "iteration": 0, "world_size": 1,
        "files": [files.rank_file(0)], "source": source, "command_line": command_line, "weights_only": True,
        "state": {"checkpoint_version": 3.0, "iteration": 0}}, indent=1)
    files.commit(release)


def to_release(merged_dir, save_dir) -> Path:
    """A weights-only checkpoint (``release``, one rank file) from a Megatron-named merged directory.

    Megatron loads it at any layout (``--load``; resharded on load); ``tools/safetensors_ckpt.py
    split`` saves it again at a given layout.
    """
    merged_dir, save_dir = Path(merged_dir), Path(save_dir)
    side = read_side_file(merged_dir)
    source = ShardedTensors(merged_dir)
    missing = [name for name in side["tensors"] if name not in source]
    if missing:
        raise CheckpointError(f"{merged_dir}: tensor {missing[0]} listed in {SIDE_FILE} is missing")
    tensors = [(name, source.get(name)) for name in side["tensors"]]
    where = {name: (entry["key"], list(entry["index"])) for name, entry in side["tensors"].items()}
    with files.staged_directory(save_dir) as temp:
        write_whole_release(temp / "release", tensors, where, tensors, str(merged_dir), side.get("command_line"))
        (temp / files.TRACKER).write_text("release")
    return save_dir
