"""Megatron's parser, with our features' flags, as data: rebuilt without importing torch or Megatron.

A run's command line is checked before anything heavy is imported (:mod:`adaptor.command_line.early_check`),
which needs the parser that ``megatron.training.arguments`` builds, and building that one imports torch
and megatron-core (about seven seconds). So ``tools/gen_docs.py --parser`` writes the parser's options,
each with its group's title, to ``megatron_parser.json`` beside this module (a plain run rewrites only
our features' rows, and writes docs/flags-megatron.md from the file), and ``--parser --check``, run by a
test, fails when the file no longer matches the installed megatron-core and our features.

A type we cannot rebuild without Megatron (its own converters, such as ``tuple_type``) is kept as the
raw string and marked ``exact: false``: the early check then leaves that flag's value to Megatron.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("megatron_parser.json")
_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
_ACTIONS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
            "_StoreConstAction": "store_const", "_AppendAction": "append", "_CountAction": "count",
            "BooleanOptionalAction": argparse.BooleanOptionalAction}


def _plain(value):
    """``value`` if JSON holds it as is, else its repr (a default only compared, never used)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    return {"repr": repr(value)}


def _group_titles(parser: argparse.ArgumentParser) -> dict[int, str]:
    """The title of each action's group, by the action's id (argparse records it on the group only)."""
    return {id(action): group.title for group in parser._action_groups for action in group._group_actions}


def snapshot(parser: argparse.ArgumentParser) -> list[dict]:
    """One row per option of ``parser``, in the parser's order, with the title of its group."""
    groups = _group_titles(parser)
    rows = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        kind = type(action).__name__
        if kind not in _ACTIONS:
            raise ValueError(f"{action.option_strings[0]}: argparse action {kind} has no snapshot form")
        type_name = getattr(action.type, "__name__", None) if action.type is not None else None
        rows.append({
            "options": list(action.option_strings), "dest": action.dest, "group": groups[id(action)], "action": kind,
            "nargs": action.nargs, "const": _plain(action.const), "default": _plain(action.default),
            "type": type_name if type_name in _TYPES else None,
            "exact": action.type is None or type_name in _TYPES,
            "choices": _plain(list(action.choices)) if action.choices is not None else None,
        })
    return rows


def dumps(rows: list[dict]) -> str:
    return "[\n" + ",\n".join(json.dumps(row, sort_keys=True) for row in rows) + "\n]\n"


def load() -> list[dict] | None:
    """The committed snapshot, or None when there is none (then nothing is checked early)."""
    try:
        return json.loads(SNAPSHOT.read_text())
    except (OSError, ValueError):
        return None


def rebuild(rows: list[dict], prog: str) -> tuple[argparse.ArgumentParser, set[str]]:
    """An equivalent parser, and the dests whose values it reproduces exactly (type and choices)."""
    parser = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    exact = set()
    for row in rows:
        action = _ACTIONS[row["action"]]
        kwargs = {"dest": row["dest"], "action": action}
        default = row["default"]
        kwargs["default"] = default if not isinstance(default, dict) else argparse.SUPPRESS
        if row["action"] in ("_StoreAction", "_AppendAction"):
            kwargs["nargs"] = row["nargs"]
            kwargs["type"] = _TYPES.get(row["type"]) if row["exact"] else None
            if row["choices"] is not None and row["exact"]:
                kwargs["choices"] = row["choices"]
        elif row["action"] == "_StoreConstAction":
            kwargs["const"] = row["const"]
        parser.add_argument(*row["options"], **kwargs)
        if row["exact"] and not isinstance(default, dict):
            exact.add(row["dest"])
    return parser, exact
