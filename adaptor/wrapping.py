"""Small helpers shared by the patches' wrappers.

A wrapper (``wrapper(wrapped, instance, call_args, kwargs)``, see :mod:`adaptor.patch_manager`; ``call_args``
because ``args`` means Megatron's argument namespace in the same code) often
needs one argument of the upstream call, however the caller passed it, or needs to show the
upstream code a changed value for the duration of one call.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable


def call_arguments(wrapped: Callable, call_args, kwargs, defaults: bool = False) -> dict[str, Any]:
    """The upstream call's arguments by parameter name; with ``defaults``, unpassed ones too."""
    bound = inspect.signature(wrapped).bind(*call_args, **kwargs)
    if defaults:
        bound.apply_defaults()
    return dict(bound.arguments)


def argument(call_args, kwargs, name: str, position: int = 0) -> Any:
    """One argument passed either by keyword ``name`` or at ``position``."""
    return kwargs[name] if name in kwargs else call_args[position]


def transformer_config(call_args, kwargs):
    """The ``TransformerConfig`` a module constructor was given, by keyword ``config`` or positionally."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if "config" in kwargs:
        return kwargs["config"]
    return next(a for a in call_args if isinstance(a, TransformerConfig))


@contextlib.contextmanager
def overridden(obj: Any, **values: Any):
    """Set attributes of ``obj`` for the duration of the block; the previous values come back after it,
    also when the block raises."""
    saved = {name: getattr(obj, name) for name in values}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield obj
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)
