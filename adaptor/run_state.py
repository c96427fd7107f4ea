"""This process's run: the backend it trains on and the features that apply to it.

A leaf: it imports nothing of this project at module level, so any library module can read it
without setting anything up. ``adaptor.bootstrap.setup()`` fills it in a training process; in a
tool or a test that only uses the libraries, the backend is detected on first use and there are
no features.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adaptor.backend import Backend
    from adaptor.features import FeatureContext, FeatureRegistry

_backend: Backend | None = None
_registry: FeatureRegistry | None = None
_context: FeatureContext | None = None


def backend() -> Backend:
    """The backend: set up by the bootstrap, or detected now (``ADAPTOR_BACKEND``, then npu > cuda > cpu)."""
    global _backend
    if _backend is None:
        from adaptor.backend import detect_backend

        _backend = detect_backend()
    return _backend


def registry() -> FeatureRegistry | None:
    """Every feature, in registry order, when this process was set up for training; else None."""
    return _registry


def context() -> FeatureContext | None:
    """The command line's pre-parsed flags and the backend the features were chosen for; else None."""
    return _context


def is_set_up() -> bool:
    return _context is not None


def record(backend_: Backend, registry_: FeatureRegistry, context_: FeatureContext) -> None:
    global _backend, _registry, _context
    _backend, _registry, _context = backend_, registry_, context_


def forget() -> None:
    global _backend, _registry, _context
    _backend = _registry = _context = None
