"""What one rank writes: its main-replica shards and objects, as one safetensors file.

The payload is built in the training process (cheap: references to tensors plus JSON) and
written by :func:`write_payload`, which is also what an async save runs in Megatron's
checkpoint worker, so it is a module-level function over plain data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from adaptor.checkpoint import files
from adaptor.checkpoint.object_codec import Encoder, EncodeError
from adaptor.checkpoint.errors import CheckpointError
from adaptor.safetensors_file import write_file


@dataclass
class FilePayload:
    """One file to write: tensors in order, and the JSON ``__metadata__`` that describes them."""
    name: str
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    json_name: str | None = None  # a JSON document written beside it (common.json)
    json_doc: dict | None = None


def _path_name(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _walk(tree, path=()):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _walk(value, path + (key,))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from _walk(value, path + (index,))
    else:
        yield path, tree


def rank_payload(sharded_part, rank: int, snapshot: bool) -> FilePayload:
    """The main replicas of this rank's ShardedTensors and ShardedObjects as a file payload.

    ``snapshot`` copies every tensor to fresh CPU memory (async saves: training goes on
    changing the originals); otherwise device tensors are copied to CPU and CPU tensors are
    written in place.
    """
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, is_main_replica

    payload = FilePayload(files.rank_file(rank))
    shards, objects = [], {}
    encoder = Encoder(prefix="__objects__.")
    for path, item in _walk(sharded_part):
        if not is_main_replica(item.replica_id):
            continue
        name = _path_name(path)
        if isinstance(item, ShardedTensor):
            tensor = item.data.detach()
            if tensor.device.type != "cpu":
                tensor = tensor.to("cpu")
            elif snapshot:
                tensor = tensor.clone()
            payload.tensors.append((name, tensor))
            flat = item.flattened_range
            shards.append({
                "name": name, "key": item.key, "dtype": str(item.dtype).removeprefix("torch."),
                "global_shape": list(item.global_shape), "global_offset": list(item.global_offset),
                "local_shape": list(item.local_shape), "prepend_axis_num": item.prepend_axis_num,
                "flattened_range": None if flat is None else [flat.start, flat.stop],
            })
        elif isinstance(item, ShardedObject):
            try:
                objects[item.unique_key] = encoder.encode(item.data, item.unique_key)
            except EncodeError as exc:
                raise CheckpointError(f"cannot save {item.unique_key}: {exc}") from None
        else:
            raise CheckpointError(f"internal: unexpected {type(item).__name__} at {name} in the sharded state dict")
    payload.tensors.extend(encoder.tensors.items())
    payload.metadata = rank_metadata(rank, shards, objects)
    return payload


def rank_metadata(rank: int, shards: list, objects: dict) -> dict[str, str]:
    """A rank file's ``__metadata__``: format, version, rank, and its shard and object tables as JSON."""
    return {
        "format": files.FORMAT_NAME, "version": str(files.BACKEND_VERSION), "rank": str(rank),
        "shards": json.dumps(shards, separators=(",", ":")),
        "objects": json.dumps(objects, separators=(",", ":")),
    }


def common_payload(common_state: dict, layout: dict, snapshot: bool) -> FilePayload:
    """Rank 0's common state as common.json, with its tensors (if any) in common.safetensors."""
    encoder = Encoder(prefix="", lenient=False)
    state = {}
    for key, value in common_state.items():
        # The argument namespace may hold run-time objects; those are dropped (and listed), the rest kept.
        encoder.lenient = key == "args"
        try:
            state[key] = encoder.encode(value, key)
        except EncodeError as exc:
            raise CheckpointError(f"cannot save the common state: {exc}") from None
    tensors = [(n, t.clone() if snapshot else t) for n, t in encoder.tensors.items()]
    doc = {"format": files.FORMAT_NAME, "version": files.BACKEND_VERSION, **layout,
           "dropped_args": encoder.dropped, "state": state}
    return FilePayload(files.COMMON_TENSORS if tensors else "", tensors, {"format": files.FORMAT_NAME},
                       json_name=files.COMMON_JSON, json_doc=doc)


def write_payload(directory: str, payloads: list[FilePayload]) -> None:
    """Write each payload durably into ``directory`` (the staging directory of the checkpoint)."""
    directory = Path(directory)
    for payload in payloads:
        if payload.name:
            write_file(directory / payload.name, payload.tensors, payload.metadata)
        if payload.json_name:
            files.write_json(directory / payload.json_name, payload.json_doc, indent=1, allow_nan=False)
