"""Setting a training process up: the command line, the features that apply, their patches.

``import adaptor`` (the statement, at the top of an entry file) calls :func:`setup`; nothing else in
the package does. It is the one place in ``adaptor/`` that reaches the features in ``patches/``.
:func:`teardown` removes every patch again, so tests can set up twice in one process.
"""
from __future__ import annotations

import sys
import warnings

from adaptor import env, run_state
from adaptor.errors import fail, is_rank0
from adaptor.features import FeatureContext, FeatureRegistry
from adaptor.patch_manager import PatchManager
from adaptor.version import SUPPORTED_MEGATRON_CORE

patch_manager = PatchManager()


def all_features() -> FeatureRegistry:
    """Every feature in registry order, none applied: what the tools and docs describe."""
    from patches import all_features  # the bootstrap edge: adaptor reaching the features

    return FeatureRegistry(all_features())


def setup(argv=None, quiet: bool = False) -> FeatureContext:
    """Detect the backend and apply the enabled features' patches (idempotent)."""
    if run_state.is_set_up():
        return run_state.context()
    from adaptor import arguments_hook
    from adaptor.backend import BackendError, detect_backend

    try:
        backend = detect_backend()
    except BackendError as exc:
        fail(str(exc))
    registry = all_features()
    argv = registry.rewrite_argv(sys.argv[1:] if argv is None else list(argv))
    context = FeatureContext(backend=backend, flags=registry.preparse(argv), argv=argv)
    run_state.record(backend, registry, context)
    enabled = registry.enabled(context)
    if backend.name != "cuda":  # expected off CUDA; Megatron warns once per module otherwise
        warnings.filterwarnings("ignore", message=r".*(transformer[ -]engine|apex)")  # case-insensitive
    for feature in enabled:
        feature.register_patches(patch_manager, context)
    # registered last, so outermost: the features check the arguments as given, before any feature's
    # own wrapper of validate_args adjusts them for Megatron's checks
    arguments_hook.register(patch_manager, registry, context)
    patch_manager.apply()
    if not (quiet or env.quiet()) and is_rank0():
        print(summary(enabled), flush=True)
    return context


def summary(enabled=None) -> str:
    """Backend, enabled features, and every applied patch grouped by the module that owns it."""
    registry, context, backend = run_state.registry(), run_state.context(), run_state.backend()
    enabled = registry.enabled(context) if enabled is None else enabled
    pending = patch_manager.pending()
    waiting = f" ({len(pending)} more when their module is first imported)" if pending else ""
    lines = [
        f"[megatron-adaptor] backend={backend.name} ({backend.source}), "
        f"distributed backend={backend.dist_backend}, megatron-core {SUPPORTED_MEGATRON_CORE}",
        f"[megatron-adaptor] features: {_by_concern(enabled) or 'none'}",
        f"[megatron-adaptor] {len(patch_manager)} patches applied{waiting}:",
    ]
    for owner, targets in patch_manager.targets_by_owner(pending=True).items():
        groups: dict[str, list[str]] = {}
        for target in targets:
            parent, _, attr = target.rpartition(".")
            groups.setdefault(parent, []).append(attr)
        text = "; ".join(f"{p}.{a[0]}" if len(a) == 1 else f"{p}.{{{','.join(a)}}}" for p, a in groups.items())
        lines.append(f"[megatron-adaptor]   {owner}: {text}")
    return "\n".join(lines)


def _by_concern(features) -> str:
    """``device: cpu_device, ...; fusions: rmsnorm, ...``: feature names under their patches/ package."""
    groups: dict[str, list[str]] = {}
    for f in features:
        parts = type(f).__module__.split(".")
        groups.setdefault(parts[1] if parts[0] == "patches" and len(parts) > 2 else parts[0], []).append(f.name)
    return "; ".join(f"{group}: {', '.join(names)}" for group, names in groups.items())


def teardown() -> None:
    """Remove every patch and forget the run, so setup() can run again."""
    patch_manager.clear()
    run_state.forget()
