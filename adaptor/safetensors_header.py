"""The header of one .safetensors file, read and checked without torch.

Format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length N,
N bytes of JSON ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}``
(padded with spaces), then the tensors' bytes, offsets relative to the end of the header.

Apart from :mod:`adaptor.safetensors_file` (data and writing, with torch) so that what only needs
names, shapes and sizes (checking a checkpoint before a run, ``tools/safetensors_ckpt.py info``)
starts without importing torch.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

# safetensors' dtype name -> (torch's name for it, bytes per element)
DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
    "U16": ("uint16", 2), "U32": ("uint32", 4), "U64": ("uint64", 8),
    "BOOL": ("bool", 1), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
}
ITEMSIZES = dict(DTYPES.values())  # bytes per element by torch's dtype name ("bfloat16": 2)
# The safetensors library refuses headers above 100 MB; so do we (a corrupt length must not allocate GBs).
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(Exception):
    """A file that is not a complete, well-formed safetensors file; the message names the file."""


class StoredTensor(NamedTuple):
    dtype: str  # safetensors' name ("BF16")
    shape: tuple[int, ...]
    begin: int  # byte offset from the end of the header
    numel: int

    @property
    def torch_dtype_name(self) -> str:
        return DTYPES[self.dtype][0]


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    data_start: int  # byte offset of the first tensor's data
    metadata: dict[str, str]
    tensors: dict[str, StoredTensor]


def read_header(path) -> SafetensorsHeader:
    """The header of ``path``, every entry checked against its dtype and the file's size."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > size - 8 or header_len > MAX_HEADER_BYTES:
                raise SafetensorsError(f"{path}: corrupt or truncated safetensors header "
                                       f"(header says {header_len} bytes, file has {size})")
            raw = handle.read(header_len)
    except OSError as exc:
        raise SafetensorsError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafetensorsError(f"{path}: corrupt safetensors header ({exc})") from exc
    data_start = 8 + header_len
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, entry in header.items():
        try:
            dtype = entry.get("dtype")
            itemsize = DTYPES[dtype][1] if dtype in DTYPES else None
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise SafetensorsError(f"{path}: corrupt header entry for tensor {name}") from exc
        if itemsize is None:
            raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {dtype!r}")
        numel = math.prod(shape)
        if begin < 0 or end - begin != numel * itemsize:
            raise SafetensorsError(f"{path}: corrupt header: tensor {name} {list(shape)} {dtype} "
                                   f"spans {end - begin} bytes")
        if data_start + end > size:
            raise SafetensorsError(f"{path}: truncated: tensor {name} ends at byte {data_start + end} "
                                   f"but the file has {size} bytes")
        tensors[name] = StoredTensor(dtype, shape, begin, numel)
    return SafetensorsHeader(path, data_start, metadata, tensors)
