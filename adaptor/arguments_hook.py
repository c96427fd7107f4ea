"""Join the features' flags, defaults and checks to Megatron's argument parsing.

Upstream: ``megatron.training.arguments.parse_args`` builds Megatron's parser
and ``validate_args`` checks the result with bare ``assert`` statements. We
wrap both:

* ``parse_args``: every feature's flags are added to Megatron's own parser
  (after the script's ``extra_args_provider``), Megatron parses the command line as
  the features rewrote it (``Feature.rewrite_argv``), then each enabled feature
  fills backend defaults for what the user did not pass explicitly. A command line the parser
  rejects is one line (with the likely spelling of an unknown flag), not argparse's usage text.
* ``validate_args``: enabled features check the arguments first, so common
  mistakes get one sentence instead of an assertion deep inside Megatron;
  any assertion Megatron's own validation still raises is reported as one
  line too, with a non-zero exit.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

from adaptor.command_line.early_check import errors_in_one_line
from adaptor.errors import fail
from adaptor.features import ArgumentError, explicit_dests
from adaptor.wrapping import argument

OWNER = "adaptor.arguments_hook"


def _failed_assertion(exc: AssertionError) -> str:
    """``assert x is not None`` failed (file:line): the statement, for Megatron's message-less asserts."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an assertion in validate_args failed"
    last = frames[-1]
    return f"`{(last.line or '').strip()}` failed ({Path(last.filename).name}:{last.lineno})"


def register(pm, registry, ctx) -> None:
    def parse_args(wrapped, instance, call_args, kwargs):
        extra = kwargs.pop("extra_args_provider", call_args[0] if call_args else None)
        rest = call_args[1:] if call_args else ()
        seen = {}

        def provider(parser):
            if extra is not None:
                parser = extra(parser)
            seen["parser"] = errors_in_one_line(registry.add_arguments(parser))
            return seen["parser"]

        # Megatron parses sys.argv: give it the command line as the features rewrite it now
        # (a program may have set sys.argv after ``import adaptor``).
        argv = ctx.argv = registry.rewrite_argv(sys.argv[1:])
        given, sys.argv = sys.argv, sys.argv[:1] + argv
        try:
            parsed = wrapped(provider, *rest, **kwargs)
        finally:
            sys.argv = given
        ctx.explicit = explicit_dests(seen["parser"], argv)
        ctx.parser = seen["parser"]
        for feature in registry.enabled(ctx):
            feature.set_defaults(parsed, ctx)
        return parsed

    def validate_args(wrapped, instance, call_args, kwargs):
        parsed = argument(call_args, kwargs, "args")
        try:
            for feature in registry.enabled(ctx):
                feature.validate(parsed, ctx)
        except ArgumentError as exc:
            fail(str(exc))
        try:
            return wrapped(*call_args, **kwargs)
        except AssertionError as exc:
            fail(f"invalid Megatron arguments: {str(exc) or _failed_assertion(exc)}")

    pm.register_wrapper("megatron.training.arguments.parse_args", parse_args, OWNER)
    pm.register_wrapper("megatron.training.arguments.validate_args", validate_args, OWNER)
