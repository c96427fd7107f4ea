"""Features: the unit in which the adaptor changes Megatron.

A feature is one class that owns one concern end to end: ``add_arguments(group)`` (its flags, in
Megatron's parser), ``enabled(ctx)`` (from the backend and the pre-parsed command line),
``register_patches(pm, ctx)`` (nothing is patched by defining a feature), ``module_swaps`` (rows of
(argument, upstream class, our class) that ``adaptor.layer_specs`` applies in registry order),
``set_defaults(args, ctx)`` (only values not in ``ctx.explicit``) and ``validate(args, ctx)`` (an
:class:`ArgumentError` of one sentence).

Features are enabled at ``import adaptor`` from a pre-parse of ``sys.argv`` that knows only their own
flags; defaults and validation run inside Megatron's argument parsing, before Megatron validates.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adaptor.command_line.flag_policy import explicit_dests  # noqa: F401  (defined torch-free)
from adaptor.errors import ArgumentError  # noqa: F401  (features raise it; defined torch-free)

if TYPE_CHECKING:  # an annotation only: the backend module imports torch
    from adaptor.backend import Backend


@dataclass
class FeatureContext:
    backend: Backend
    flags: argparse.Namespace  # features' own flags, pre-parsed from argv
    explicit: set[str] = field(default_factory=set)  # dests given on the command line
    argv: list[str] | None = None  # the command line after the features' rewrites (None: sys.argv as given)
    parser: argparse.ArgumentParser | None = None  # Megatron's parser with the features' flags, once built


class Feature:
    """Base class; subclasses override what they need."""

    name: str = ""
    #: Backends the feature applies on; a subset of ("npu", "cuda", "cpu").
    backends: Sequence[str] = ("npu", "cuda", "cpu")
    #: Megatron's own on/off flags this feature reacts to (e.g. "--use-flash-attn"). Megatron's
    #: parser owns them; the pre-parse reads them too so ``enabled(ctx)`` can see them in ctx.flags.
    upstream_flags: Sequence[str] = ()
    #: Layer-spec swaps: (gate, upstream class "module:Name", our class "module:Name"). The gate is
    #: an argument dest that turns the row on, or ``dest>N`` (on when the argument exceeds N).
    #: Applied to the local spec only; where two features swap the same upstream class, the one
    #: later in the registry wins.
    module_swaps: Sequence[tuple[str, str, str]] = ()

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        """Register this feature's flags (dest names must not clash with Megatron's)."""

    def rewrite_argv(self, argv: list[str]) -> list[str]:
        """The command line in the words Megatron's parser knows (another project's spellings, say).

        Called for every registered feature, before features are chosen and before Megatron parses;
        a feature that rewrites says what it changed when the run starts.
        """
        return argv

    def enabled(self, ctx: FeatureContext) -> bool:
        return ctx.backend.name in self.backends

    def register_patches(self, pm, ctx: FeatureContext) -> None:
        """Register patches with ``pm``; called only when enabled."""

    def set_defaults(self, args: argparse.Namespace, ctx: FeatureContext) -> None:
        """Fill backend-dependent defaults for values not given explicitly."""

    def validate(self, args: argparse.Namespace, ctx: FeatureContext) -> None:
        """Raise ArgumentError for a configuration this feature cannot run."""


class FeatureRegistry:
    #: The title of the parser group holding every feature's flags (their heading in ``--help``).
    GROUP_TITLE = "megatron-adaptor"

    def __init__(self, features: Iterable[Feature] = ()) -> None:
        self._features: list[Feature] = []
        for f in features:
            self.add(f)

    def add(self, feature: Feature) -> None:
        if not feature.name:
            raise ValueError(f"{type(feature).__name__} has no name")
        if any(f.name == feature.name for f in self._features):
            raise ValueError(f"feature {feature.name!r} registered twice")
        self._features.append(feature)

    def __iter__(self):
        return iter(self._features)

    def add_arguments(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        group = parser.add_argument_group(title=self.GROUP_TITLE)
        for f in self._features:
            f.add_arguments(group)
        return parser

    def rewrite_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` through every feature's :meth:`Feature.rewrite_argv`, in registry order."""
        argv = list(argv)
        for f in self._features:
            argv = f.rewrite_argv(argv)
        return argv

    def preparse(self, argv: Sequence[str]) -> argparse.Namespace:
        """Parse only the features' flags out of ``argv``, ignoring everything else."""
        parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        self.add_arguments(parser)
        for flag in sorted({flag for f in self._features for flag in f.upstream_flags}):
            parser.add_argument(flag, action="store_true")
        flags, _ = parser.parse_known_args(list(argv))
        return flags

    def enabled(self, ctx: FeatureContext) -> list[Feature]:
        return [f for f in self._features if f.enabled(ctx)]

