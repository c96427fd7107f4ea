"""Hugging Face safetensors directories: zero-copy reads and a streaming, sharded writer.

Single files are read and written by :mod:`adaptor.safetensors_file`; this module adds the Hub's
directory layout (one ``model.safetensors``, or shards plus ``model.safetensors.index.json``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

import torch

from adaptor.convert.errors import ConversionError
from adaptor.safetensors_file import SafetensorsError, SafetensorsFile, header_bytes, tensor_bytes

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class HfCheckpoint:
    """A Hub-style directory: config.json + model.safetensors, or shards + model.safetensors.index.json.

    Headers of every file are read and checked when the checkpoint is opened (missing
    shards, truncated files, names the index lists but the shard lacks); tensor data is
    memory-mapped and returned without copying.
    """

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise ConversionError(f"{self.path}: not a directory")
        config_file = self.path / "config.json"
        if not config_file.is_file():
            raise ConversionError(f"{config_file}: missing (a Hugging Face checkpoint needs config.json)")
        try:
            self.config: dict = json.loads(config_file.read_text())
        except json.JSONDecodeError as exc:
            raise ConversionError(f"{config_file}: not valid JSON ({exc})") from exc
        index_file = self.path / INDEX_FILE
        if index_file.is_file():
            try:
                weight_map: dict[str, str] = json.loads(index_file.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ConversionError(f"{index_file}: not a safetensors index ({exc})") from exc
        elif (self.path / SINGLE_FILE).is_file():
            weight_map = None
        else:
            raise ConversionError(f"{self.path}: no {SINGLE_FILE} and no {INDEX_FILE}")
        self._files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, SafetensorsFile] = {}
        if weight_map is None:
            file = self._open(SINGLE_FILE, None)
            self._where = {name: file for name in file.tensors}
            return
        for name, file_name in weight_map.items():
            file = self._open(file_name, name)
            if name not in file.tensors:
                raise ConversionError(f"{file.path}: tensor {name} listed in {INDEX_FILE} is not in this file")
            self._where[name] = file

    def _open(self, file_name: str, first_tensor: str | None) -> SafetensorsFile:
        if file_name not in self._files:
            file_path = self.path / file_name
            if not file_path.is_file():
                raise ConversionError(f"{file_path}: missing shard (holds tensor {first_tensor} "
                                      f"according to {INDEX_FILE})")
            try:
                self._files[file_name] = SafetensorsFile(file_path)
            except SafetensorsError as exc:
                raise ConversionError(str(exc)) from None
        return self._files[file_name]

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def _file(self, name: str) -> SafetensorsFile:
        try:
            return self._where[name]
        except KeyError:
            raise ConversionError(f"{self.path}: tensor {name} not found in the checkpoint") from None

    def spec(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype from the header, without reading data."""
        dtype, shape, _, _ = self._file(name).tensors[name]
        return shape, dtype

    def get(self, name: str) -> torch.Tensor:
        """The tensor, memory-mapped (no copy)."""
        return self._file(name).get(name)

    def release(self, name: str) -> None:
        """After a tensor was used: give its memory-mapped pages back (unchanged pages, re-read on demand)."""
        self._file(name).release(name)

    def get_meta(self, name: str) -> torch.Tensor:
        shape, dtype = self.spec(name)
        return torch.empty(shape, dtype=dtype, device="meta")


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


def write_safetensors_checkpoint(save_dir, specs: list[tuple[str, torch.Tensor]],
                                 tensors: Iterable[tuple[str, torch.Tensor]],
                                 max_shard_bytes: int = 5 * 2**30) -> list[str]:
    """Write tensors into `save_dir` as the Hub does, one tensor in memory at a time.

    `specs` gives every (name, meta tensor) in the order `tensors` will yield them, so each
    shard's header is written before its data. One shard: model.safetensors; more:
    model-0000i-of-0000N.safetensors plus model.safetensors.index.json. Returns the file names.
    """
    save_dir = Path(save_dir)
    shards = plan_shards(specs, max_shard_bytes)
    count = len(shards)
    names = [SINGLE_FILE] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    source: Iterator = iter(tensors)
    weight_map, total = {}, 0
    for file_name, shard in zip(names, shards):
        header = header_bytes((n, m.dtype, tuple(m.shape)) for n, m in shard)
        with open(save_dir / file_name, "wb") as out:
            out.write(header)
            for name, meta in shard:
                got_name, tensor = next(source, (None, None))
                if got_name != name or tuple(tensor.shape) != tuple(meta.shape) or tensor.dtype != meta.dtype:
                    got = None if got_name is None else f"{got_name} {list(tensor.shape)} {tensor.dtype}"
                    raise ConversionError(f"internal: expected tensor {name} {list(meta.shape)} {meta.dtype}, "
                                          f"got {got}")
                out.write(tensor_bytes(tensor))
                del tensor
                weight_map[name] = file_name
                total += meta.numel() * meta.element_size()
    leftover = next(source, None)
    if leftover is not None:
        raise ConversionError(f"internal: tensor {leftover[0]} was not planned")
    if count > 1:
        (save_dir / INDEX_FILE).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return names
