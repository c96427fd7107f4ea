"""Stream documents into Megatron's indexed dataset format (``.bin`` + ``.idx``), safely.

The format is what ``megatron.core.datasets.indexed_dataset`` reads and what its
``IndexedDatasetBuilder`` / ``_IndexWriter`` write (megatron-core 0.19.2):

* ``.bin``: every document's token ids, back to back, in the dataset's dtype
  (native byte order, as numpy's ``tobytes`` writes them).
* ``.idx``: ``b"MMIDIDX\\x00\\x00"``, version ``<Q 1``, dtype code ``<B``,
  sequence count ``<Q``, document count ``<Q``, then the sequence lengths
  (int32), the byte offset of each sequence in the ``.bin`` (int64), and the
  document indices (int64, ``0, 1, ..., n`` here: one sequence per document,
  as Megatron-LM's preprocess_data.py writes without ``--split-sentences``).

Lengths spill to a temporary file (the builder keeps a list), so memory stays flat. Outputs are
written under hidden names (``.{name}.bin.{host}.{pid}.tmp``); :meth:`IndexedDatasetWriter.publish`
removes the old ``.idx``, renames ``.bin`` then ``.idx``, so a crash never leaves a new ``.bin``
beside an old ``.idx``. Needs only numpy and the standard library.
"""
from __future__ import annotations

import os
import shutil
import socket
import struct

import numpy as np

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# megatron.core.datasets.indexed_dataset.DType: name -> code.
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}
TMP_SUFFIX = ".tmp"
_BLOCK = 1 << 20  # index entries handled per block when building the .idx


def optimal_dtype(vocab_size):
    """Megatron's ``DType.optimal_dtype``: uint16 below 65500 entries, else int32."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def _tag() -> str:
    host = socket.gethostname().replace(os.sep, "_") or "host"
    return f"{host}.{os.getpid()}"


def temp_path(final_path: str, kind: str, tag: str | None = None) -> str:
    """Hidden temporary name for ``final_path`` (``kind``: bin, idx or lengths) in its directory."""
    directory, name = os.path.split(final_path)
    stem = name[: -len(".bin")] if name.endswith(".bin") else name
    return os.path.join(directory, f".{stem}.{kind}.{tag or _tag()}{TMP_SUFFIX}")


def remove_stale_temps(prefix: str) -> list[str]:
    """Remove temporary files that an earlier, killed run at ``prefix`` left on this host.

    Only files whose process id is no longer running are removed, so two runs
    writing the same prefix at once do not delete each other's files.
    """
    directory, stem = os.path.split(prefix)
    directory = directory or "."
    host = socket.gethostname().replace(os.sep, "_") or "host"
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        for kind in ("bin", "idx", "lengths"):
            start = f".{stem}.{kind}.{host}."
            if not (name.startswith(start) and name.endswith(TMP_SUFFIX)):
                continue
            pid = name[len(start): -len(TMP_SUFFIX)]
            if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
                continue
            try:
                os.remove(os.path.join(directory, name))
                removed.append(os.path.join(directory, name))
            except OSError:
                pass
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(directory: str) -> None:
    """adaptor.checkpoint.files.fsync_dir's twin: importing any ``adaptor`` module sets the package up
    (torch included), and this writer serves tools/preprocess_data.py's torch-free start."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # the new .bin/.idx names may not survive a crash: the write fails
        raise OSError(exc.errno, f"cannot make {directory} durable: fsync failed ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)


class IndexedDatasetWriter:
    """Write one ``{prefix}.bin`` / ``{prefix}.idx`` pair, streamed, under temporary names.

    ``add_documents(tokens, lengths)`` appends documents given as one flat
    array of token ids (already in ``dtype``) and the length of each document.
    ``finalize()`` writes the index; ``publish()`` moves both files into place;
    ``abort()`` removes whatever was written. Usable as a context manager that
    aborts on an exception (publishing stays explicit).
    """

    def __init__(self, prefix: str, dtype, tag: str | None = None) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype.name not in DTYPE_CODES:
            raise ValueError(f"dtype {self.dtype} is not one Megatron's indexed dataset can hold")
        self.prefix = prefix
        self.bin_path, self.idx_path = prefix + ".bin", prefix + ".idx"
        tag = tag or _tag()
        self.tmp_bin = temp_path(self.bin_path, "bin", tag)
        self.tmp_idx = temp_path(self.bin_path, "idx", tag)
        self.tmp_lengths = temp_path(self.bin_path, "lengths", tag)
        self.n_documents = 0
        self.n_tokens = 0
        self._bin = self._lengths = None
        self._finalized = self._published = False
        try:
            self._bin = open(self.tmp_bin, "wb", buffering=4 << 20)
            self._lengths = open(self.tmp_lengths, "wb", buffering=1 << 20)
        except BaseException:
            self.abort()
            raise

    # Writing ---------------------------------------------------------------------------------
    def add_documents(self, tokens: np.ndarray, lengths) -> None:
        tokens = np.ascontiguousarray(tokens)
        if tokens.dtype != self.dtype:
            raise TypeError(f"tokens are {tokens.dtype}, this dataset holds {self.dtype}")
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size == 0:
            if tokens.size:
                raise ValueError("tokens given without document lengths")
            return
        if int(lengths.sum()) != tokens.size or int(lengths.min()) < 0:
            raise ValueError(f"document lengths sum to {int(lengths.sum())}, but {tokens.size} tokens were given")
        if int(lengths.max()) > np.iinfo(np.int32).max:
            raise ValueError("a document longer than 2**31-1 tokens does not fit the index (int32 lengths)")
        if tokens.size:
            self._bin.write(memoryview(tokens).cast("B"))
        self._lengths.write(lengths.astype(np.int32).tobytes())
        self.n_documents += int(lengths.size)
        self.n_tokens += int(tokens.size)

    def add_document(self, ids) -> None:
        ids = np.asarray(ids)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) > np.iinfo(self.dtype).max):
            raise ValueError(f"token ids {int(ids.min())}..{int(ids.max())} do not fit {self.dtype}")
        self.add_documents(ids.astype(self.dtype), [ids.size])

    # Finishing -------------------------------------------------------------------------------
    def finalize(self) -> None:
        """Close the data file and write the index, both still under temporary names."""
        if self._finalized:
            return
        for f in (self._bin, self._lengths):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        n = self.n_documents
        itemsize = np.int64(self.dtype.itemsize)
        with open(self.tmp_idx, "wb", buffering=4 << 20) as idx, open(self.tmp_lengths, "rb") as lengths:
            idx.write(INDEX_HEADER)
            idx.write(struct.pack("<Q", INDEX_VERSION))
            idx.write(struct.pack("<B", DTYPE_CODES[self.dtype.name]))
            idx.write(struct.pack("<Q", n))  # sequences: one per document
            idx.write(struct.pack("<Q", n + 1))  # document indices: 0, 1, ..., n
            shutil.copyfileobj(lengths, idx, 4 << 20)  # sequence lengths, int32
            lengths.seek(0)
            offset = np.int64(0)  # byte offset of each sequence in the .bin, int64
            while block := lengths.read(_BLOCK * 4):
                nbytes = np.frombuffer(block, dtype=np.int32).astype(np.int64) * itemsize
                ends = np.cumsum(nbytes) + offset
                idx.write((ends - nbytes).tobytes())
                offset = ends[-1]
            for start in range(0, n + 1, _BLOCK):  # document indices, int64
                idx.write(np.arange(start, min(n + 1, start + _BLOCK), dtype=np.int64).tobytes())
            idx.flush()
            os.fsync(idx.fileno())
        os.remove(self.tmp_lengths)
        self._finalized = True

    def publish(self) -> None:
        """Move the finished pair into place: old .idx out first, then .bin, then .idx."""
        if not self._finalized:
            self.finalize()
        if os.path.lexists(self.idx_path):
            os.remove(self.idx_path)  # from here the old pair no longer looks complete
        os.replace(self.tmp_bin, self.bin_path)
        os.replace(self.tmp_idx, self.idx_path)
        self._published = True
        _fsync_dir(os.path.dirname(self.bin_path))

    def abort(self) -> None:
        """Close and remove every temporary file (the final names are never touched)."""
        for f in (self._bin, self._lengths):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:
                    pass
        if self._published:
            return
        for path in (self.tmp_bin, self.tmp_idx, self.tmp_lengths):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
