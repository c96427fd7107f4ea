"""One .safetensors file: a checked, memory-mapped reader and a durable writer.

Format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length N,
N bytes of JSON ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}``
(padded with spaces), then the tensors' bytes, offsets relative to the end of the header.

Both the Hugging Face conversion (``adaptor.convert``) and the sharded training checkpoints
(``adaptor.checkpoint``) read and write through this module. Nothing here unpickles: a file
is a JSON header and raw little-endian bytes.
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

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# The safetensors library refuses headers above 100 MB; so do we (a corrupt length must not allocate GBs).
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(Exception):
    """A file that is not a complete, well-formed safetensors file; the message names the file."""


class SafetensorsFile:
    """Header parsed and checked against the file size when opened; data mapped on first read."""

    def __init__(self, path):
        self.path = Path(path)
        self._map = None
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as handle:
                prefix = handle.read(8)
                if len(prefix) < 8:
                    raise SafetensorsError(f"{self.path}: truncated safetensors file ({size} bytes, no header)")
                (header_len,) = struct.unpack("<Q", prefix)
                if header_len > size - 8 or header_len > MAX_HEADER_BYTES:
                    raise SafetensorsError(f"{self.path}: corrupt or truncated safetensors header "
                                           f"(header says {header_len} bytes, file has {size})")
                raw = handle.read(header_len)
        except OSError as exc:
            raise SafetensorsError(f"{self.path}: cannot read: {exc.strerror}") from exc
        try:
            header = json.loads(raw)
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
        except (UnicodeDecodeError, ValueError) as exc:
            raise SafetensorsError(f"{self.path}: corrupt safetensors header ({exc})") from exc
        self.data_start = 8 + header_len
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self.tensors: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for name, entry in header.items():
            try:
                dtype = DTYPES.get(entry.get("dtype"))
                shape = tuple(int(d) for d in entry["shape"])
                begin, end = (int(x) for x in entry["data_offsets"])
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise SafetensorsError(f"{self.path}: corrupt header entry for tensor {name}") from exc
            if dtype is None:
                raise SafetensorsError(f"{self.path}: tensor {name} has unsupported dtype {entry.get('dtype')!r}")
            numel = math.prod(shape)
            if begin < 0 or end - begin != numel * dtype.itemsize:
                raise SafetensorsError(f"{self.path}: corrupt header: tensor {name} {list(shape)} {entry['dtype']} "
                                       f"spans {end - begin} bytes")
            if self.data_start + end > size:
                raise SafetensorsError(f"{self.path}: truncated: tensor {name} ends at byte {self.data_start + end} "
                                       f"but the file has {size} bytes")
            self.tensors[name] = (dtype, shape, begin, numel)

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


def write_file(path, tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None) -> int:
    """Write one safetensors file atomically: a hidden temporary beside ``path``, fsync, rename.

    A reader therefore sees either no file or the whole file. Returns the bytes written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    header = header_bytes(((n, t.dtype, tuple(t.shape)) for n, t in tensors), metadata)
    try:
        with open(tmp, "wb") as out:
            out.write(header)
            for _, tensor in tensors:
                out.write(tensor_bytes(tensor))
            out.flush()
            os.fsync(out.fileno())
            written = out.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return written
