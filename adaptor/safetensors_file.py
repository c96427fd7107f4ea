"""One .safetensors file: a memory-mapped reader and a durable writer.

The header is read and checked by :mod:`adaptor.safetensors_header` (without torch, so tools can
describe files before importing it); this module maps the data as tensors and writes files.
Both the Hugging Face conversion (``adaptor.convert``) and the sharded training checkpoints
(``adaptor.checkpoint``) read and write through it. Nothing here unpickles: a file is a JSON
header and raw little-endian bytes.

Why not ``safetensors.safe_open``: the reader hands out zero-copy views of the mapping and gives
their pages back once used (streaming a model larger than memory through a conversion), and a bad
header is one line naming the file; the writer streams planned tensors under a header written
first and fsyncs before the rename. safe_open offers neither page release nor streamed writes.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from pathlib import Path
from typing import Iterable

import torch

from adaptor.checkpoint.files import fsync_dir  # noqa: F401  (also this module's: writers here use it)
from adaptor.safetensors_header import (
    DTYPES,
    SafetensorsError,  # noqa: F401  (readers catch it from here too)
    SafetensorsHeader,
    read_header,
)

TORCH_DTYPES = {name: getattr(torch, torch_name) for name, (torch_name, _) in DTYPES.items()}
DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}


class SafetensorsFile:
    """Header parsed and checked when opened; data mapped on first read."""

    def __init__(self, source):
        """``source``: the file's path, or its header already read (:func:`read_header`)."""
        header = source if isinstance(source, SafetensorsHeader) else read_header(source)
        self.path = header.path
        self.data_start = header.data_start
        self.metadata = header.metadata
        self.tensors: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {
            name: (TORCH_DTYPES[t.dtype], t.shape, t.begin, t.numel) for name, t in header.tensors.items()}
        self._map = None

    def get(self, name: str) -> torch.Tensor:
        """The tensor as a copy-on-write view of the mapped file (no read until touched)."""
        dtype, shape, begin, numel = self.tensors[name]
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        if self._map is None:
            with open(self.path, "rb") as handle:
                # ACCESS_COPY: writable to torch (no warning), pages shared with the page cache until written.
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(self._map, dtype=dtype, count=numel, offset=self.data_start + begin)
        return flat.view(shape)

    def release(self, name: str) -> None:
        """Drop the tensor's pages from this process (they are re-read from the file if used again)."""
        if self._map is None:
            return
        dtype, _, begin, numel = self.tensors[name]
        page = mmap.PAGESIZE
        start = (self.data_start + begin) // page * page
        end = self.data_start + begin + numel * dtype.itemsize
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a tensor still views the map; the mapping goes with it
                pass
            self._map = None


def header_bytes(entries: Iterable[tuple[str, torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix and JSON header for tensors laid out back to back in ``entries`` order."""
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    position = 0
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [position, position + nbytes]}
        position += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def tensor_bytes(tensor: torch.Tensor):
    """A buffer over the tensor's bytes (one contiguous copy at most)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def planned(specs, tensors):
    """``tensors`` as they come, each checked against its plan in ``specs`` ((name, meta tensor), same order):
    a writer that wrote a header from ``specs`` first must get exactly those names, shapes and dtypes."""
    source = iter(tensors)
    for name, meta in specs:
        got_name, tensor = next(source, (None, None))
        if got_name != name or tuple(tensor.shape) != tuple(meta.shape) or tensor.dtype != meta.dtype:
            got = None if got_name is None else f"{got_name} {list(tensor.shape)} {tensor.dtype}"
            raise SafetensorsError(f"internal: expected tensor {name} {list(meta.shape)} {meta.dtype}, got {got}")
        yield name, tensor
        del tensor
    leftover = next(source, None)
    if leftover is not None:
        raise SafetensorsError(f"internal: tensor {leftover[0]} was not planned")


def write_file(path, tensors, metadata: dict[str, str] | None = None, specs=None) -> int:
    """Write one safetensors file atomically: a hidden temporary beside ``path``, fsync, rename.

    A reader therefore sees either no file or the whole file. ``tensors``: a list of (name, tensor); or,
    with ``specs`` (name, meta tensor) giving the header first, a stream of them, written one at a time
    and checked against the plan (:func:`planned`). Returns the bytes written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if specs is None:
        specs = tensors
    else:
        tensors = planned(specs, tensors)
    header = header_bytes(((n, t.dtype, tuple(t.shape)) for n, t in specs), metadata)
    try:
        with open(tmp, "wb") as out:
            out.write(header)
            for _, tensor in tensors:
                out.write(tensor_bytes(tensor))
                del tensor
            out.flush()
            os.fsync(out.fileno())
            written = out.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return written
