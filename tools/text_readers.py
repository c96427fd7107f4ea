"""Input files for tools/preprocess_data.py: which files, in what order, cut into chunks of documents.

Standard library only (pyarrow for parquet), so it is cheap to import and test.
:func:`resolve_inputs` turns ``--input`` files, globs and directories into a sorted, de-duplicated
list; :func:`iter_chunks` yields bounded :class:`Chunk`\\ s of raw records (the parent reads, workers
parse); :func:`parse_chunk` gives each key's texts or a problem naming ``file:line``.

Formats, by extension (after an optional ``.gz``/``.bz2``/``.xz``):
``.jsonl``/``.json``/``.ndjson``: one JSON object per line; ``.parquet``: one
row per document; anything else: plain text, one document per line
(``line``) or per file (``file``). A directory contributes the files in it
(recursively, hidden ones excluded) whose extension is one of
:data:`DATA_EXTENSIONS`; a file named on the command line or matched by a glob
is read whatever its extension.
"""
from __future__ import annotations

import bz2
import glob
import gzip
import json
import lzma
import os
from dataclasses import dataclass, field
from typing import Iterator, List, Optional

JSONL_EXTENSIONS = (".jsonl", ".json", ".ndjson")
TEXT_EXTENSIONS = (".txt", ".text")
PARQUET_EXTENSIONS = (".parquet",)
COMPRESSION = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
DATA_EXTENSIONS = JSONL_EXTENSIONS + TEXT_EXTENSIONS + PARQUET_EXTENSIONS
MAX_REPORTED_BAD = 5  # problems quoted per chunk when bad lines are skipped


class InputError(Exception):
    """A problem with the input, reported to the user as one line."""


# Which files ---------------------------------------------------------------------------------

def _split_compression(path: str):
    lower = path.lower()
    for ext, opener in COMPRESSION.items():
        if lower.endswith(ext):
            return lower[: -len(ext)], opener
    return lower, None


def file_format(path: str, text_document_per: str = "line") -> str:
    """``jsonl``, ``parquet``, ``text-line`` or ``text-file``, from the file name."""
    name, compression = _split_compression(path)
    if name.endswith(JSONL_EXTENSIONS):
        return "jsonl"
    if name.endswith(PARQUET_EXTENSIONS):
        if compression is not None:
            raise InputError(f"{path}: parquet files compress internally; decompress it first")
        return "parquet"
    return "text-file" if text_document_per == "file" else "text-line"


def is_data_file(path: str) -> bool:
    name, _ = _split_compression(path)
    return name.endswith(DATA_EXTENSIONS)


def _walk(directory: str) -> List[str]:
    found = []
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(root, f) for f in sorted(files) if not f.startswith(".") and is_data_file(f))
    return sorted(found, key=lambda p: os.path.relpath(p, directory).split(os.sep))


def resolve_inputs(specs: List[str]) -> List[str]:
    """Files named by ``--input`` values, in a deterministic order, each once."""
    files: List[str] = []
    for spec in specs:
        if os.path.isdir(spec):
            found = _walk(spec)
            if not found:
                raise InputError(f"--input {spec}: the directory holds no data files "
                                 f"({', '.join(DATA_EXTENSIONS)}, optionally .gz/.bz2/.xz)")
        elif os.path.exists(spec):
            found = [spec]
        elif glob.has_magic(spec):
            found = sorted(p for p in glob.glob(spec, recursive=True) if not os.path.isdir(p))
            if not found:
                raise InputError(f"--input {spec}: no files match")
        else:
            raise InputError(f"--input {spec}: no such file or directory")
        files.extend(found)
    seen, unique = set(), []
    for path in files:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


# Reading -------------------------------------------------------------------------------------

@dataclass
class Chunk:
    """A run of records from one file (``kind`` is the file format).

    ``records``: raw lines (bytes, newline included) for ``jsonl`` and
    ``text-line``; ``(path, bytes)`` per file for ``text-file`` (one chunk may
    hold several small files); ``{key: list of values}`` for ``parquet``.
    ``first`` is the line (or row) number of the first record, from 1.
    """

    kind: str
    path: str
    first: int
    records: object


def _open_binary(path: str):
    _, opener = _split_compression(path)
    try:
        return opener(path, "rb") if opener else open(path, "rb", buffering=1 << 20)
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from exc


def iter_chunks(files: List[str], keys: List[str], text_document_per: str = "line",
                batch_size: int = 1000, max_chunk_bytes: int = 16 << 20) -> Iterator[Chunk]:
    """Read ``files`` in order; each chunk holds at most ``batch_size`` documents.

    A chunk also closes once it holds ``max_chunk_bytes`` (a single longer
    document still makes one chunk), so memory is bounded by the number of
    chunks in flight, not by the size of the input.
    """
    pending_files: list = []
    pending_bytes = 0
    for path in files:
        kind = file_format(path, text_document_per)
        if kind == "text-file":
            with _open_binary(path) as f:
                data = _read(f, path)
            pending_files.append((path, data))
            pending_bytes += len(data)
            if len(pending_files) >= batch_size or pending_bytes >= max_chunk_bytes:
                yield Chunk("text-file", path, 1, pending_files)
                pending_files, pending_bytes = [], 0
            continue
        if pending_files:  # keep file order: earlier whole-file documents go first
            yield Chunk("text-file", pending_files[-1][0], 1, pending_files)
            pending_files, pending_bytes = [], 0
        if kind == "parquet":
            yield from _parquet_chunks(path, keys, batch_size)
        else:
            yield from _line_chunks(path, kind, batch_size, max_chunk_bytes)
    if pending_files:
        yield Chunk("text-file", pending_files[-1][0], 1, pending_files)


def _read(f, path: str) -> bytes:
    try:
        return f.read()
    except (OSError, EOFError) as exc:  # also a truncated .gz
        raise InputError(f"{path}: cannot read: {exc}") from exc


def _line_chunks(path: str, kind: str, batch_size: int, max_chunk_bytes: int) -> Iterator[Chunk]:
    with _open_binary(path) as f:
        lines: list = []
        nbytes, first = 0, 1
        try:
            for line in f:
                lines.append(line)
                nbytes += len(line)
                if len(lines) >= batch_size or nbytes >= max_chunk_bytes:
                    yield Chunk(kind, path, first, lines)
                    first += len(lines)
                    lines, nbytes = [], 0
        except (OSError, EOFError) as exc:
            raise InputError(f"{path}:{first + len(lines)}: cannot read: {exc}") from exc
        if lines:
            yield Chunk(kind, path, first, lines)


def parquet_available() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def open_parquet(path: str):
    """``pyarrow.parquet.ParquetFile`` for ``path``; a missing pyarrow or an unreadable file is an InputError."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InputError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from exc
    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own error types
        raise InputError(f"{path}: not a readable parquet file: {exc}") from exc


def _parquet_chunks(path: str, keys: List[str], batch_size: int) -> Iterator[Chunk]:
    parquet = open_parquet(path)
    import pyarrow as pa
    schema = parquet.schema_arrow
    for key in keys:
        if key not in schema.names:
            raise InputError(f"{path}: no column {key!r} (columns: {', '.join(schema.names)})")
        column_type = schema.field(key).type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
            raise InputError(f"{path}: column {key!r} holds {column_type}, expected strings")
    first = 1
    try:
        for batch in parquet.iter_batches(batch_size=batch_size, columns=list(dict.fromkeys(keys))):
            columns = {key: batch.column(key).to_pylist() for key in keys}
            yield Chunk("parquet", path, first, (columns, batch.nbytes))
            first += batch.num_rows
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{path}: row {first}: cannot read: {exc}") from exc


# Parsing (in the worker processes) -------------------------------------------------------------

@dataclass
class Parsed:
    """Document texts per key (aligned: index i of every key is the same record)."""

    texts: dict
    where: list = field(default_factory=list)  # "file:line" of each record, for later problems
    n_records: int = 0  # documents read (bad lines excluded)
    n_bytes: int = 0  # input bytes this chunk covered
    n_bad: int = 0
    bad: list = field(default_factory=list)  # the first few problems, when skipping
    error: Optional[str] = None  # the problem that stops the run, when not skipping


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def _utf8_problem(raw: bytes, exc: UnicodeDecodeError) -> str:
    return f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line)"


def parse_chunk(chunk: Chunk, keys: List[str], skip_bad: bool) -> Parsed:
    """Texts for each key; a bad record stops here unless ``skip_bad``."""
    parsed = Parsed(texts={key: [] for key in keys})
    single = keys[0]

    def bad(where: str, problem: str) -> bool:
        """Record a problem; True when the run must stop."""
        message = f"{where}: {problem}"
        if not skip_bad:
            parsed.error = message
            return True
        parsed.n_bad += 1
        if len(parsed.bad) < MAX_REPORTED_BAD:
            parsed.bad.append(message)
        return False

    def accept(where: str, values) -> None:
        for key, value in zip(keys, values):
            parsed.texts[key].append(value)
        parsed.where.append(where)
        parsed.n_records += 1

    if chunk.kind == "jsonl":
        for i, raw in enumerate(chunk.records):
            parsed.n_bytes += len(raw)
            if not raw.strip():
                continue  # blank lines (a trailing newline, say) are not documents
            where = f"{chunk.path}:{chunk.first + i}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if bad(where, _utf8_problem(raw, exc)):
                    return parsed
                continue
            if chunk.first + i == 1 and line.startswith("\ufeff"):
                line = line[1:]
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                if bad(where, f"malformed JSON: {exc.msg} (column {exc.colno})"):
                    return parsed
                continue
            if not isinstance(obj, dict):
                if bad(where, f"expected a JSON object, got {_json_type(obj)}"):
                    return parsed
                continue
            problem = None
            for key in keys:
                if key not in obj:
                    present = ", ".join(repr(k) for k in list(obj)[:8]) or "none"
                    problem = f"missing key {key!r} (keys: {present})"
                    break
                if not isinstance(obj[key], str):
                    problem = f"key {key!r} is {_json_type(obj[key])}, expected a string"
                    break
            if problem is not None:
                if bad(where, problem):
                    return parsed
                continue
            accept(where, [obj[key] for key in keys])
    elif chunk.kind == "text-line":
        for i, raw in enumerate(chunk.records):
            parsed.n_bytes += len(raw)
            where = f"{chunk.path}:{chunk.first + i}"
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if bad(where, _utf8_problem(raw, exc)):
                    return parsed
                continue
            if chunk.first + i == 1 and text.startswith("\ufeff"):
                text = text[1:]
            accept(where, [text] * len(keys))
    elif chunk.kind == "text-file":
        for path, raw in chunk.records:
            parsed.n_bytes += len(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = raw.count(b"\n", 0, exc.start) + 1
                column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1)
                problem = f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {column + 1} of the line)"
                if bad(f"{path}:{line}", problem):
                    return parsed
                continue
            accept(path, [text.removeprefix("\ufeff")] * len(keys))
    elif chunk.kind == "parquet":
        columns, nbytes = chunk.records
        parsed.n_bytes += nbytes
        for i in range(len(columns[single])):
            where = f"{chunk.path}: row {chunk.first + i}"
            values = [columns[key][i] for key in keys]
            missing = [key for key, value in zip(keys, values) if value is None]
            if missing:
                if bad(where, f"key {missing[0]!r} is null"):
                    return parsed
                continue
            accept(where, values)
    else:
        raise ValueError(f"unknown chunk kind {chunk.kind!r}")
    return parsed
