"""A Megatron indexed dataset (``prefix.idx`` + ``prefix.bin``) checked from its header.

The ``.idx`` layout, as ``megatron.core.datasets.indexed_dataset._IndexWriter`` writes it:
9 magic bytes ``MMIDIDX\\0\\0``, a little-endian u64 version (1), a u8 dtype code, u64
sequence count N, u64 document count D, then int32 sequence lengths[N], int64 byte
pointers[N], int64 document indices[D], and optionally int8 sequence modes[N].

Upstream reads the header with bare ``assert`` statements (``AssertionError: bad header``)
and never compares the ``.bin`` with what the index says it holds, so a ``.bin`` cut short
by an interrupted copy trains until a DataLoader worker reads past its end. Here the
header, the ``.idx`` size and the ``.bin`` size (last pointer + last length x item size)
are compared before anything is built: a few reads, whatever the dataset's size.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from adaptor.errors import ArgumentError

MAGIC = b"MMIDIDX\x00\x00"
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8
# megatron.core.datasets.indexed_dataset.DType: code -> numpy dtype
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}


def _read_at(stream, offset: int, size: int) -> bytes:
    stream.seek(offset)
    return stream.read(size)


def check_prefix(prefix: str, flag: str) -> None:
    """Raise ArgumentError unless ``prefix.idx`` is a well-formed index whose ``prefix.bin`` has the bytes it describes."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    missing = [p for p in (bin_, idx) if not os.path.isfile(p)]
    if missing:
        raise ArgumentError(f"{flag}: dataset {prefix!r} has no {' or '.join(missing)}")
    idx_size, bin_size = os.path.getsize(idx), os.path.getsize(bin_)
    try:
        with open(idx, "rb") as stream:
            head = stream.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES or head[:len(MAGIC)] != MAGIC:
                raise ArgumentError(f"{flag}: {idx} is not a Megatron index file (it does not start with the "
                                    f"MMIDIDX header); rebuild it with tools/preprocess_data.py")
            version, code, sequences, documents = struct.unpack("<QBQQ", head[len(MAGIC):])
            if version != 1:
                raise ArgumentError(f"{flag}: {idx} has index version {version}; Megatron reads version 1")
            if code not in DTYPES:
                raise ArgumentError(f"{flag}: {idx} names token dtype code {code}, which is none of Megatron's "
                                    f"({', '.join(f'{c}={np.dtype(t).name}' for c, t in DTYPES.items())})")
            plain = HEADER_BYTES + sequences * (4 + 8) + documents * 8
            if idx_size not in (plain, plain + sequences):  # + one int8 mode per sequence
                raise ArgumentError(f"{flag}: {idx} is {idx_size} bytes but its header describes {sequences} sequences "
                                    f"and {documents} document boundaries ({plain} bytes): the file is cut short or "
                                    f"was not written by Megatron's index writer")
            if documents < 1:
                raise ArgumentError(f"{flag}: {idx} has no document boundaries (a valid index has at least one)")
            itemsize = np.dtype(DTYPES[code]).itemsize
            if sequences == 0:
                expected = 0
            else:
                last_length, = struct.unpack("<i", _read_at(stream, HEADER_BYTES + (sequences - 1) * 4, 4))
                last_pointer, = struct.unpack("<q", _read_at(stream, HEADER_BYTES + sequences * 4 + (sequences - 1) * 8, 8))
                expected = last_pointer + last_length * itemsize
            first_doc, = struct.unpack("<q", _read_at(stream, HEADER_BYTES + sequences * 12, 8))
            last_doc, = struct.unpack("<q", _read_at(stream, HEADER_BYTES + sequences * 12 + (documents - 1) * 8, 8))
    except OSError as exc:
        raise ArgumentError(f"{flag}: cannot read {idx}: {exc.strerror or exc}") from None
    if first_doc != 0 or last_doc != sequences:
        raise ArgumentError(f"{flag}: {idx} has document boundaries {first_doc}..{last_doc} for {sequences} sequences "
                            f"(they must run from 0 to {sequences}): the index is damaged")
    if bin_size != expected:
        how = "shorter" if bin_size < expected else "longer"
        raise ArgumentError(f"{flag}: {bin_} is {bin_size} bytes, {how} than the {expected} bytes its .idx describes "
                            f"({sequences} sequences of {np.dtype(DTYPES[code]).name}): a copy cut short, or a .bin and "
                            f".idx from different runs")
