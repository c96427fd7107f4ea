"""What happens to each of Megatron's command-line flags on our training path.

Megatron's parser accepts about 800 flags; many only mean something to a program other than
``pretrain_gpt.py`` (the inference server, RL, biencoder training) or to kernels a backend does
not have (Transformer Engine, apex). Given to us, such a flag would parse, do nothing, and let a
user believe they trained with it. So every flag of Megatron's parser has one policy here:

* :class:`Honoured`: the value reaches code that runs on our path and does what its help says;
* :class:`Refused`: a non-default value given on the command line ends in one line naming the
  flag and what to do instead (optionally only where a requirement is missing, or for some values);
* :class:`NotApplied`: a pure speed or memory optimisation of another backend; the run goes on
  with the flag at its default and one printed line says so.

The table itself is data (:mod:`adaptor.command_line.flag_table`); ``tests`` walk Megatron's whole parser and
fail when a flag has no entry, so a new megatron-core release cannot add a silent one.
"""
from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

#: Requirements a Refused entry may name: the refusal holds only where they are missing.
REQUIREMENTS = ("transformer_engine", "apex", "cuda")


@dataclass(frozen=True)
class Honoured:
    """Acted on by Megatron's loop, our entry files or a feature; ``where`` says by what, when not obvious."""

    where: str = ""


@dataclass(frozen=True)
class Refused:
    """A non-default value ends the run before any work, with ``why`` (which says what to do)."""

    why: str
    requires: tuple[str, ...] = ()  # refused only where one of these is missing
    values: Callable[[object], bool] | None = field(default=None, compare=False)  # refused only for these values

    def applies(self, value, available: Callable[[str], bool]) -> bool:
        if self.values is not None and not self.values(value):
            return False
        return not self.requires or not all(available(r) for r in self.requires)


@dataclass(frozen=True)
class NotApplied:
    """Accepted with one printed line, then reset to its default: ``why`` says what it would speed up and where."""

    why: str
    requires: tuple[str, ...] = ()  # applied (honoured) where all of these are present


Policy = Honoured | Refused | NotApplied
HONOURED = Honoured()


def requirement_checker(backend: str) -> Callable[[str], bool]:
    """``available(name)`` for this backend: cuda means the CUDA backend, the rest an importable module."""

    def available(name: str) -> bool:
        if name == "cuda":
            return backend == "cuda"
        if name not in REQUIREMENTS:
            raise ValueError(f"unknown requirement {name!r}")
        if backend != "cuda":
            return False  # TE and apex kernels run on CUDA only
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return available


def flag_name(parser: argparse.ArgumentParser, dest: str) -> str:
    """The long option that sets ``dest`` (the first one Megatron lists)."""
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return max(action.option_strings, key=lambda s: s.startswith("--"))
    return "--" + dest.replace("_", "-")


def parser_defaults(parser: argparse.ArgumentParser) -> dict:
    """dest -> default of every option (the first action's, where two flags share a dest)."""
    defaults: dict = {}
    for action in parser._actions:
        if action.option_strings:
            defaults.setdefault(action.dest, action.default)
    return defaults


def explicit_dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """Dests of the options that appear on ``argv`` (``--x`` or ``--x=v``)."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    return {
        action.dest
        for action in parser._actions
        if any(opt in given for opt in action.option_strings)
    }


@dataclass
class Verdict:
    refused: list[str] = field(default_factory=list)  # one line each
    not_applied: list[tuple[str, str]] = field(default_factory=list)  # (dest, line)


def judge(args: argparse.Namespace, parser: argparse.ArgumentParser, table: Mapping[str, Policy],
          explicit: Iterable[str], backend: str) -> Verdict:
    """Policies for the flags given explicitly with a value other than Megatron's default."""
    available = requirement_checker(backend)
    defaults = parser_defaults(parser)
    verdict = Verdict()
    for dest in sorted(set(explicit)):
        policy = table.get(dest)
        if policy is None or isinstance(policy, Honoured) or dest not in defaults:
            continue
        value = getattr(args, dest, None)
        if value == defaults[dest] and getattr(policy, "values", None) is None:
            continue  # given, but as Megatron's default (a value-specific refusal still looks)
        flag = flag_name(parser, dest)
        if isinstance(policy, Refused) and policy.applies(value, available):
            verdict.refused.append(f"{flag}: {policy.why}")
        elif isinstance(policy, NotApplied) and not (policy.requires and all(available(r) for r in policy.requires)):
            verdict.not_applied.append((dest, f"{flag} is not applied on the {backend} backend: {policy.why}"))
    return verdict
