"""What a safetensors checkpoint holds: its common description and every rank file's shard table.

A checkpoint records, for each tensor a rank wrote, its key, dtype, global shape and the box it
covers (``global_offset`` + local shape, after ``prepend_axis_num`` unit axes), or a contiguous
range of that box flattened (``flattened_range``: a distributed-optimizer shard in model space).
All of it is JSON: ``common.json`` and each rank file's safetensors header. Reading it needs no
torch, so ``tools/safetensors_ckpt.py info`` answers in a fraction of a second;
:class:`adaptor.checkpoint.reader.CheckpointIndex` reads the tensors on top of this table.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from adaptor.checkpoint import files
from adaptor.checkpoint.errors import CheckpointError
from adaptor.safetensors_header import ITEMSIZES, SafetensorsError, SafetensorsHeader, read_header


@dataclass(frozen=True)
class SavedShard:
    file: str
    name: str
    key: str
    dtype: str  # torch's name ("bfloat16"); the reader makes the torch.dtype
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    local_shape: tuple[int, ...]
    prepend_axis_num: int
    flattened_range: tuple[int, int] | None

    @property
    def box_shape(self) -> tuple[int, ...]:
        """The local shape with the prepended unit axes: as many dimensions as the global shape."""
        return (1,) * self.prepend_axis_num + self.local_shape

    @property
    def box(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.global_offset, self.box_shape


class ShardTable:
    """One finished checkpoint directory: its common description and the shard table of every rank file."""

    def __init__(self, checkpoint_dir):
        self.dir = Path(checkpoint_dir)
        common_path = self.dir / files.COMMON_JSON
        try:
            self.doc = json.loads(common_path.read_text())
            if self.doc.get("format") != files.FORMAT_NAME:
                raise ValueError(f"format is {self.doc.get('format')!r}, not {files.FORMAT_NAME!r}")
            rank_files = list(self.doc["files"])
        except FileNotFoundError:
            raise CheckpointError(f"{common_path}: missing; {self.dir} is not a complete safetensors checkpoint") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{common_path}: not a valid checkpoint description ({exc})") from None
        for name in rank_files:
            if not files.is_rank_file(files.member(self.dir, name).name):
                raise CheckpointError(f"{common_path}: {name!r} is not a rank file name")
        self.rank_files = rank_files
        self.headers: dict[str, SafetensorsHeader] = {}  # file name -> its header, as read
        self._shards: dict[str, list[SavedShard]] | None = None
        self._objects: dict[str, tuple[str, object]] = {}

    @property
    def shards(self) -> dict[str, list[SavedShard]]:
        """Key -> saved shards, from every rank file's header (read on first use)."""
        if self._shards is None:
            self._shards = defaultdict(list)
            for name in self.rank_files:
                path = files.member(self.dir, name)
                if not path.is_file():
                    raise CheckpointError(f"{path}: missing (one of the {len(self.rank_files)} rank files "
                                          f"{files.COMMON_JSON} lists); the checkpoint is incomplete")
                self._read_rank_file(name, path)
        return self._shards

    @property
    def objects(self) -> dict[str, tuple[str, object]]:
        """Unique key -> (rank file, encoded value) of every non-tensor object the ranks saved."""
        self.shards  # noqa: B018 - reads the rank files
        return self._objects

    def _read_header(self, name: str, path: Path) -> SafetensorsHeader:
        """The header of the checkpoint's file ``name`` (at ``path``), kept in :attr:`headers`."""
        try:
            header = read_header(path)
        except SafetensorsError as exc:
            raise CheckpointError(str(exc)) from None
        self.headers[name] = header
        return header

    def _read_rank_file(self, name: str, path: Path) -> None:
        header = self._read_header(name, path)
        try:
            if header.metadata.get("format") != files.FORMAT_NAME:
                raise ValueError("not written by this format")
            table = json.loads(header.metadata["shards"])
            objects = json.loads(header.metadata["objects"])
            for entry in table:
                if entry["dtype"] not in ITEMSIZES:
                    raise ValueError(f"unknown dtype {entry['dtype']!r}")
                shard = SavedShard(
                    file=name, name=entry["name"], key=entry["key"], dtype=entry["dtype"],
                    global_shape=tuple(entry["global_shape"]), global_offset=tuple(entry["global_offset"]),
                    local_shape=tuple(entry["local_shape"]), prepend_axis_num=int(entry["prepend_axis_num"]),
                    flattened_range=None if entry["flattened_range"] is None else tuple(entry["flattened_range"]),
                )
                self._check_entry(header, shard)
                self._shards[shard.key].append(shard)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: corrupt shard table in the safetensors metadata ({exc})") from None
        for unique_key, value in objects.items():
            self._objects[unique_key] = (name, value)

    @staticmethod
    def _check_entry(header: SafetensorsHeader, shard: SavedShard) -> None:
        stored = header.tensors.get(shard.name)
        if stored is None:
            raise CheckpointError(f"{header.path}: tensor {shard.name} ({shard.key}) is listed but not stored")
        if shard.flattened_range is None:
            ok = stored.shape == shard.local_shape
        else:
            ok = len(stored.shape) == 1 and stored.shape[0] == shard.flattened_range[1] - shard.flattened_range[0]
        dtype = stored.torch_dtype_name
        if dtype != shard.dtype or not ok or len(shard.global_offset) != len(shard.global_shape):
            raise CheckpointError(f"{header.path}: tensor {shard.name} ({shard.key}) is stored as {list(stored.shape)} "
                                  f"{dtype}, its shard table says {list(shard.box_shape)} {shard.dtype}")
