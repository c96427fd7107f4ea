"""The key-by-key checker of model.json and data.json, and the record a model.json becomes.

Shared by :mod:`adaptor.mm.config` (the LLaVA files, and the dispatch on ``model_id``) and the model
families' own readers (:mod:`adaptor.mm.qwen_vl.model_json`), which therefore need not import each other.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class MMConfigError(ValueError):
    """A problem in model.json or data.json, as one line naming file and JSON path."""


@dataclass(frozen=True)
class Key:
    """One JSON key: its type, whether it must be given, its default, its allowed values."""

    kind: Any  # int, float, bool, str, "floats3" (three numbers), "ints" (a list of integers),
    # "object" (an object or null, checked by its reader), None (only null)
    required: bool = False
    default: Any = None
    choices: tuple = ()


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               "floats3": "a list of three numbers", "ints": "a list of integers",
               "object": "an object or null", None: "null"}


def _value(value, key: Key, where: str):
    kind = key.kind
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        bool: isinstance(value, bool),
        str: isinstance(value, str),
        None: value is None,
        "floats3": isinstance(value, list) and len(value) == 3
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value),
        "ints": isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
        "object": value is None or isinstance(value, dict),
    }[kind]
    if not ok:
        raise MMConfigError(f"{where}: expected {_TYPE_NAMES[kind]}, got {json.dumps(value)}")
    if key.choices and value not in key.choices:
        raise MMConfigError(f"{where}: {json.dumps(value)} is not one of {', '.join(map(json.dumps, key.choices))}")
    if kind is float:
        return float(value)
    if kind == "floats3":
        return tuple(float(v) for v in value)
    if kind == "ints":
        return tuple(value)
    return value


def check_section(obj, schema: dict, path: str, file: str) -> dict:
    """``obj`` checked against ``schema`` (nested dicts of :class:`Key`); defaults filled in."""
    where = f"{file}: {path}" if path else file
    if not isinstance(obj, dict):
        raise MMConfigError(f"{where}: expected an object, got {json.dumps(obj)[:40]}")
    unknown = [k for k in obj if k not in schema]
    if unknown:
        raise MMConfigError(f"{file}: {_join(path, unknown[0])}: unknown key (known here: {', '.join(schema)})")
    out = {}
    for name, key in schema.items():
        sub = _join(path, name)
        if isinstance(key, dict):
            if name not in obj:
                raise MMConfigError(f"{file}: {sub}: missing")
            out[name] = check_section(obj[name], key, sub, file)
        elif name in obj:
            out[name] = _value(obj[name], key, f"{file}: {sub}")
        elif key.required:
            raise MMConfigError(f"{file}: {sub}: missing")
        else:
            out[name] = key.default
    return out


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def read_json(path) -> tuple[dict, Path]:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise MMConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return json.loads(text), file
    except json.JSONDecodeError as exc:
        raise MMConfigError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def resolve(base: Path, value: str | None) -> str | None:
    """A path from a config file, relative to that file's directory."""
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base.parent / p))


@dataclass
class MMModelConfig:
    file: str
    vision: dict
    projector: dict
    text: dict
    # "llava", or a model of :mod:`adaptor.mm.qwen_vl.model_json` (which fills the fields below)
    model_id: str = "llava"
    hf_config: dict | None = None  # the whole model as a Hugging Face config.json would describe it
    init_from_hf_path: str | None = None  # a Hugging Face directory whose weights start the run
    # where that directory was named: model.json's key, or the command line's --hf-load-dir
    hf_dir_source: str = "init_from_hf_path"
    taken_from_hf: tuple = ()  # JSON paths whose placeholder value was replaced by config.json's
    patch_notices: tuple = ()  # one line per ``patch`` switch that changes nothing here (adaptor.mm.patch_section)

    def where(self, section: str, key: str) -> str:
        prefix = {"vision": "image_encoder.vision_encoder", "projector": "image_encoder.vision_projector",
                  "text": "text_decoder"}[section]
        return f"{self.file}: {prefix}.{key}"
