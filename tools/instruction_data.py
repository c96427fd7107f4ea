"""Instruction (chat) records for tools/preprocess_data.py: MindSpeed-LLM's handlers, reading, packing.

* **Handlers**: ``AlpacaStyleInstructionHandler`` (``instruction``/``input``/``output``, optional
  ``system``, ``history``) and ``SharegptStyleInstructionHandler`` (``conversations`` of ``{"from",
  "value"}`` or ``messages`` of ``{"role", "content"}``); ``--map-keys`` renames as MindSpeed-LLM's
  (and LLaMA-Factory's) dataset attributes do (:func:`parse_map_keys`).
* **Reading**: JSON lines, a ``.json`` array, or parquet (pyarrow); ``.gz``/``.bz2``/``.xz`` decompressed.
* **Packing**: :class:`Packer` best-fits whole conversations into samples of ``capacity`` tokens
  among a bounded number of open samples.

Record problems raise :class:`chat_template.RecordError`, run problems :class:`InstructionError`; one line each.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator, List, Optional

from chat_template import RecordError
from text_readers import COMPRESSION, Chunk, InputError, file_format, open_parquet

ALPACA = "AlpacaStyleInstructionHandler"
SHAREGPT = "SharegptStyleInstructionHandler"
HANDLERS = (ALPACA, SHAREGPT)
FIELDS = ("input_ids", "labels", "attention_mask")

# MindSpeed-LLM's column defaults (LLaMA-Factory's): alpaca reads instruction/input/output; system and
# history are read when a record has them.
ALPACA_KEYS = {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
               "history": "history"}
SHAREGPT_KEYS = {"messages": "conversations", "system": "system", "tools": "tools"}
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
# MindSpeed-LLM's OpenAI-format defaults: used for a record that has ``messages`` instead of ``conversations``.
OPENAI_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
               "observation_tag": "tool", "function_tag": "function_call", "system_tag": "system"}


class InstructionError(InputError):
    """The run cannot build this instruction dataset (one line)."""


# --map-keys -----------------------------------------------------------------------------------------

def parse_map_keys(text: Optional[str], handler: str) -> dict:
    """The handler's column names and tags with ``--map-keys`` applied.

    Alpaca: ``prompt``, ``query``, ``response``, ``system``, ``history``. ShareGPT: ``messages``,
    ``system``, ``tools`` and the tags ``role_tag``, ``content_tag``, ``user_tag``,
    ``assistant_tag``, ``observation_tag``, ``function_tag``, ``system_tag`` (at the top level or
    inside ``"tags": {...}``, MindSpeed-LLM's spelling). A column mapped to ``""`` or null is not read.
    """
    keys = dict(ALPACA_KEYS if handler == ALPACA else {**SHAREGPT_KEYS, **SHAREGPT_TAGS})
    keys["_explicit"] = set()
    if text is None:
        return keys
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise InstructionError(f"--map-keys {text!r}: not valid JSON ({exc.args[0].split(':')[0]})") from None
    if not isinstance(given, dict):
        raise InstructionError(f"--map-keys {text!r}: expected a JSON object such as "
                               '\'{"prompt": "instruction", "query": "input", "response": "output"}\'')
    if handler == SHAREGPT and isinstance(given.get("tags"), dict):
        given = {**{k: v for k, v in given.items() if k != "tags"}, **given["tags"]}
    for name, value in given.items():
        if name not in keys or name == "_explicit":
            known = ", ".join(k for k in keys if k != "_explicit")
            raise InstructionError(f"--map-keys: {name!r} is not a {handler} key (known: {known})")
        if value is not None and not isinstance(value, str):
            raise InstructionError(f"--map-keys: {name!r} maps to {json.dumps(value)}, expected a column name")
        keys[name] = value or None
        keys["_explicit"].add(name)
    return keys


def public_keys(keys: dict) -> dict:
    return {k: v for k, v in keys.items() if k != "_explicit"}


# Records -> conversations ---------------------------------------------------------------------------

def _string(record: dict, column: Optional[str], what: str, required: bool = False) -> str:
    if column is None:
        return ""
    if column not in record or record[column] is None:
        if required:
            present = ", ".join(repr(k) for k in list(record)[:8]) or "none"
            raise RecordError(f"missing key {column!r} ({what}; keys: {present})")
        return ""
    value = record[column]
    if not isinstance(value, str):
        raise RecordError(f"key {column!r} ({what}) is {type(value).__name__}, expected a string")
    return value


def alpaca_conversation(record: dict, keys: dict):
    """MindSpeed-LLM's alpaca conversion: history pairs, then ``instruction\\ninput``, then the response."""
    messages = []
    system = _string(record, keys["system"], "system")
    if system:
        messages.append({"role": "system", "content": system})
    history = record.get(keys["history"]) if keys["history"] else None
    if history is not None:
        if not isinstance(history, list):
            raise RecordError(f"key {keys['history']!r} (history) is {type(history).__name__}, expected a list "
                              f"of [prompt, response] pairs")
        for turn in history:
            if not (isinstance(turn, (list, tuple)) and len(turn) == 2 and all(isinstance(t, str) for t in turn)):
                raise RecordError(f"key {keys['history']!r} (history) holds {repr(turn)[:60]}, expected "
                                  f"[prompt, response] string pairs")
            messages += [{"role": "user", "content": turn[0]}, {"role": "assistant", "content": turn[1]}]
    prompt = _string(record, keys["prompt"], "prompt", required=True)
    query = _string(record, keys["query"], "query")
    messages.append({"role": "user", "content": "\n".join(part for part in (prompt, query) if part)})
    response = _string(record, keys["response"], "response", required=True)
    messages.append({"role": "assistant", "content": response})
    return messages, None


def _tools(record: dict, column: Optional[str]):
    value = record.get(column) if column else None
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise RecordError(f"key {column!r} (tools) is not JSON") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RecordError(f"key {column!r} (tools) should be a list of JSON schemas")
    return value


def _tool_calls(value, where: str) -> list:
    """A ShareGPT ``function_call`` turn: ``{"name", "arguments"}`` (or a list of them), maybe as a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise RecordError(f"{where}: a function_call turn holds no JSON") from None
    calls = value if isinstance(value, list) else [value]
    if not calls or not all(isinstance(c, dict) and "name" in (c.get("function") or c) for c in calls):
        raise RecordError(f"{where}: a function_call turn should hold {{\"name\": ..., \"arguments\": ...}}")
    return [{"type": "function", "function": c.get("function") or c} for c in calls]


def sharegpt_conversation(record: dict, keys: dict):
    """ShareGPT ``conversations`` (from/value) or OpenAI ``messages`` (role/content) to messages."""
    column, tags = keys["messages"], {k: keys[k] for k in SHAREGPT_TAGS}
    if column not in record and "messages" not in keys["_explicit"] and "messages" in record:
        column = "messages"
        tags = {k: keys[k] if k in keys["_explicit"] else OPENAI_TAGS[k] for k in OPENAI_TAGS}
    if column not in record:
        present = ", ".join(repr(k) for k in list(record)[:8]) or "none"
        raise RecordError(f"missing key {column!r} (messages; keys: {present})")
    turns = record[column]
    if not isinstance(turns, list):
        raise RecordError(f"key {column!r} (messages) is {type(turns).__name__}, expected a list of turns")
    roles = {tags["user_tag"]: "user", tags["assistant_tag"]: "assistant", tags["system_tag"]: "system",
             tags["observation_tag"]: "tool", tags["function_tag"]: "function_call"}
    role_tag, content_tag = tags["role_tag"], tags["content_tag"]
    messages = []
    leading_system = bool(turns) and isinstance(turns[0], dict) and turns[0].get(role_tag) == tags["system_tag"]
    system = "" if leading_system else _string(record, keys["system"], "system")  # a system turn wins
    if system:
        messages.append({"role": "system", "content": system})
    for n, turn in enumerate(turns, 1):
        where = f"turn {n}"
        if not isinstance(turn, dict) or role_tag not in turn:
            raise RecordError(f"{where} has no {role_tag!r} key")
        role = roles.get(turn[role_tag])
        if role is None:
            raise RecordError(f"{where}: role {turn[role_tag]!r} is not one of {', '.join(map(repr, roles))}")
        content = turn.get(content_tag)
        if role == "function_call":
            message = {"role": "assistant", "content": "", "tool_calls": _tool_calls(content, where)}
        else:
            if content is None and not (role == "assistant" and turn.get("tool_calls")):
                raise RecordError(f"{where} has no {content_tag!r} key")
            if content is not None and not isinstance(content, str):
                raise RecordError(f"{where}: {content_tag!r} is {type(content).__name__}, expected a string")
            message = {k: v for k, v in turn.items() if k not in (role_tag, content_tag)}
            message.update(role=role, content=content if content is not None else "")
        messages.append(message)
    return messages, _tools(record, keys["tools"])


CONVERTERS = {ALPACA: alpaca_conversation, SHAREGPT: sharegpt_conversation}


# Reading --------------------------------------------------------------------------------------------

def _open(path: str):
    opener = next((o for ext, o in COMPRESSION.items() if path.lower().endswith(ext)), None)
    try:
        return opener(path, "rb") if opener else open(path, "rb", buffering=1 << 20)
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from exc


def _is_json_array(path: str) -> bool:
    with _open(path) as f:
        try:
            head = f.read(4096)
        except (OSError, EOFError) as exc:
            raise InputError(f"{path}: cannot read: {exc}") from exc
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")


def check_input_format(path: str) -> str:
    """``jsonl``, ``json-array`` or ``parquet``; plain text is not instruction data."""
    kind = file_format(path)
    if kind.startswith("text"):
        raise InstructionError(f"{path}: instruction data is read from JSON lines (.jsonl/.json), a JSON array "
                               f"(.json) or parquet, not plain text")
    name = path.lower()
    for ext in COMPRESSION:
        name = name.removesuffix(ext)
    if kind == "jsonl" and name.endswith(".json") and _is_json_array(path):
        return "json-array"
    return kind


def iter_record_chunks(files: List[str], batch_size: int, max_chunk_bytes: int = 16 << 20) -> Iterator[Chunk]:
    """Chunks of at most ``batch_size`` records: raw lines (jsonl), objects (JSON array), rows (parquet)."""
    for path in files:
        kind = check_input_format(path)
        if kind == "jsonl":
            with _open(path) as f:
                lines, nbytes, first = [], 0, 1
                try:
                    for line in f:
                        lines.append(line)
                        nbytes += len(line)
                        if len(lines) >= batch_size or nbytes >= max_chunk_bytes:
                            yield Chunk("jsonl", path, first, lines)
                            first, lines, nbytes = first + len(lines), [], 0
                except (OSError, EOFError) as exc:
                    raise InputError(f"{path}:{first + len(lines)}: cannot read: {exc}") from exc
                if lines:
                    yield Chunk("jsonl", path, first, lines)
        elif kind == "json-array":
            with _open(path) as f:
                try:
                    data = f.read()
                except (OSError, EOFError) as exc:
                    raise InputError(f"{path}: cannot read: {exc}") from exc
            try:
                records = json.loads(data.decode("utf-8-sig"))
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}: not valid UTF-8 (byte {exc.start + 1})") from exc
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{exc.lineno}: malformed JSON array: {exc.msg} (column {exc.colno})") from exc
            if not isinstance(records, list):
                raise InputError(f"{path}: expected a JSON array of records")
            for start in range(0, len(records), batch_size):
                yield Chunk("records", path, start + 1, records[start:start + batch_size])
        else:
            yield from _parquet_rows(path, batch_size)


def _parquet_rows(path: str, batch_size: int) -> Iterator[Chunk]:
    parquet = open_parquet(path)
    first = 1
    try:
        for batch in parquet.iter_batches(batch_size=batch_size):
            yield Chunk("parquet", path, first, batch.to_pylist())
            first += batch.num_rows
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{path}: row {first}: cannot read: {exc}") from exc


def chunk_records(chunk: Chunk):
    """``(where, record or RecordError)`` for each record of a chunk (blank lines skipped); input bytes."""
    out, nbytes = [], 0
    if chunk.kind == "jsonl":
        for i, raw in enumerate(chunk.records):
            nbytes += len(raw)
            if not raw.strip():
                continue
            where = f"{chunk.path}:{chunk.first + i}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                out.append((where, RecordError(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte "
                                               f"{exc.start + 1} of the line)")))
                continue
            try:
                obj = json.loads(line.removeprefix("\ufeff") if chunk.first + i == 1 else line)
            except json.JSONDecodeError as exc:
                out.append((where, RecordError(f"malformed JSON: {exc.msg} (column {exc.colno})")))
                continue
            out.append((where, obj))
    else:
        label = "element" if chunk.kind == "records" else "row"
        for i, obj in enumerate(chunk.records):
            if chunk.kind == "parquet":  # a null column is an absent key (rows share one schema)
                obj = {key: value for key, value in obj.items() if value is not None}
            out.append((f"{chunk.path}: {label} {chunk.first + i}", obj))
    for k, (where, obj) in enumerate(out):
        if not isinstance(obj, (dict, RecordError)):
            kind = "an array" if isinstance(obj, list) else type(obj).__name__
            out[k] = (where, RecordError(f"expected a JSON object, got {kind}"))
    return out, nbytes


# Packing --------------------------------------------------------------------------------------------

@dataclass
class _Open:
    order: int
    used: tuple
    items: list


class Packer:
    """Whole items into samples of at most ``capacity`` tokens (best fit, ``max_open`` open samples).

    An item's length is an int, or a tuple of ints for items laid out in several parallel rows (a DPO
    pair: its chosen and its rejected side, each row holding the same items in the same order); each
    row then has ``capacity`` tokens. ``add(item, length)`` returns the samples it completed (each a
    list of items, in the order they were added); ``flush()`` returns the rest, oldest first. A sample
    is closed as soon as one of its rows is full (no item fits any more), and when more than
    ``max_open`` are open the fullest one is closed.
    """

    def __init__(self, capacity: int, max_open: int = 64) -> None:
        self.capacity, self.max_open = capacity, max_open
        self._open: list = []
        self._count = 0

    def add(self, item, length) -> list:
        lengths = tuple(length) if isinstance(length, (tuple, list)) else (length,)
        if max(lengths) > self.capacity:
            raise ValueError(f"an item of {max(lengths)} tokens does not fit a sample of {self.capacity}")

        def left(b):  # tokens free in the sample's rows after this item
            return sum(self.capacity - u - n for u, n in zip(b.used, lengths))

        fits = [b for b in self._open if all(u + n <= self.capacity for u, n in zip(b.used, lengths))]
        if fits:
            target = min(fits, key=lambda b: (left(b), b.order))
        else:
            target = _Open(self._count, (0,) * len(lengths), [])
            self._count += 1
            self._open.append(target)
        target.items.append(item)
        target.used = tuple(u + n for u, n in zip(target.used, lengths))
        done = []
        if max(target.used) == self.capacity:
            self._open.remove(target)
            done.append(target.items)
        while len(self._open) > self.max_open:
            fullest = max(self._open, key=lambda b: (sum(b.used), -b.order))
            self._open.remove(fullest)
            done.append(fullest.items)
        return done

    def flush(self) -> list:
        done = [b.items for b in sorted(self._open, key=lambda b: b.order)]
        self._open = []
        return done
