"""Module-name patterns of the FSDP2 YAML (``sub_modules_to_wrap``, ``ignored_modules``, ``recompute_modules``).

A pattern names modules by their dotted path inside the model, as ``named_modules()`` spells it
from the GPT model down (``embedding``, ``decoder.layers.3``, ``decoder.layers.3.mlp``,
``output_layer``), and must match a whole name. The syntax follows MindSpeed-MM's:

* ``*`` any run of characters, dots included; ``?`` one character;
* ``{*}`` one integer (a layer index); ``{0-3,6,8-9}`` an integer in that union of ranges;
* every other character stands for itself.

``decoder.layers.{*}`` therefore matches each layer but none of its children, while
``decoder.layers.*`` matches the layers and everything inside them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class PatternError(ValueError):
    """A pattern that cannot be read; the message says what is wrong with it."""


@dataclass(frozen=True)
class ModulePattern:
    text: str
    regex: re.Pattern
    ranges: tuple  # per {...} group: None for {*}, else a tuple of (low, high)

    def matches(self, name: str) -> bool:
        found = self.regex.fullmatch(name)
        if found is None:
            return False
        for digits, allowed in zip(found.groups(), self.ranges):
            if allowed is not None and not any(low <= int(digits) <= high for low, high in allowed):
                return False
        return True


def _ranges(inner: str, text: str):
    if inner.strip() == "*":
        return None
    spans = []
    for part in inner.split(","):
        found = _RANGE.match(part)
        if found is None:
            raise PatternError(f"{text!r}: {{{inner}}} is neither {{*}} nor integer ranges like {{0-3,6}}")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        if low > high:
            raise PatternError(f"{text!r}: range {part.strip()} runs backwards")
        spans.append((low, high))
    return tuple(spans)


def _glob(piece: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in piece)


def compile_pattern(text: str) -> ModulePattern:
    if not isinstance(text, str) or not text.strip():
        raise PatternError(f"{text!r} is not a module name pattern")
    text = text.strip()
    if any(c in "{}" for outside in _BRACE.split(text)[::2] for c in outside):
        raise PatternError(f"{text!r}: unbalanced brace")
    parts, ranges, end = [], [], 0
    for found in _BRACE.finditer(text):
        parts.append(_glob(text[end:found.start()]))
        ranges.append(_ranges(found.group(1), text))
        parts.append(r"(\d+)")
        end = found.end()
    parts.append(_glob(text[end:]))
    return ModulePattern(text, re.compile("".join(parts)), tuple(ranges))


def matching(patterns, named_modules):
    """``(name, module)`` pairs, in module order, whose name matches any of ``patterns``."""
    return [(name, module) for name, module in named_modules if any(p.matches(name) for p in patterns)]
