"""megatron-adaptor: run megatron-core 0.19.2's own training loop on NPU, GPU and CPU.

``import adaptor`` (first line of a training script, or after megatron was
imported — both orders work) does, once:

1. checks that megatron-core is the supported version;
2. picks the backend (``npu`` > ``cuda`` > ``cpu``; ``ADAPTOR_BACKEND`` overrides);
3. rewrites ``sys.argv`` where a feature knows another project's spelling of a Megatron
   flag (MindSpeed-LLM's), pre-parses it for the features' own flags and asks every
   feature whether it applies to this backend and command line;
4. registers and applies the enabled features' patches, rebinding aliases;
5. prints the backend and the applied patches (rank 0 only).

``adaptor.teardown()`` removes every patch again.

Layers: the entry files import this package; ``setup()`` takes the features from ``patches/``;
the features use the machinery in this package's modules (patch manager, registry, backend,
ops, checkpoint and conversion libraries), which never import a feature. With
``ADAPTOR_PATCH=0`` (set by the tools that do not train) only the backend is detected: the
libraries work and nothing in torch or Megatron changes.
"""
from __future__ import annotations

import sys
import warnings

from adaptor import env
from adaptor.version import SUPPORTED_MEGATRON_CORE, check_megatron_version

check_megatron_version()
if env.is_on("ADAPTOR_PATCH"):  # a training run: its command line first, before torch is imported
    from adaptor.command_line.early_check import check_entry_command_line

    check_entry_command_line()

from adaptor.backend import Backend, BackendError, detect_backend  # noqa: E402
from adaptor.errors import fail, is_rank0  # noqa: E402
from adaptor.features import Feature, FeatureContext, FeatureRegistry  # noqa: E402
from adaptor.patch_manager import PatchManager  # noqa: E402

__all__ = ["setup", "teardown", "backend", "patch_manager", "registry", "context", "SUPPORTED_MEGATRON_CORE"]
__version__ = "0.1.0"

backend: Backend | None = None
patch_manager = PatchManager()
registry: FeatureRegistry | None = None
context: FeatureContext | None = None


def _detected_backend() -> Backend:
    """The backend this process runs on; an unknown or unusable ``ADAPTOR_BACKEND`` is one line."""
    try:
        return detect_backend()
    except BackendError as exc:
        fail(str(exc))


def setup(argv=None, quiet: bool = False) -> FeatureContext:
    """Detect the backend and apply the enabled features' patches (idempotent)."""
    global backend, registry, context
    if context is not None:
        return context
    from adaptor import arguments_hook
    from patches import all_features

    backend = _detected_backend()
    registry = FeatureRegistry(all_features())
    argv = registry.rewrite_argv(sys.argv[1:] if argv is None else list(argv))
    context = FeatureContext(backend=backend, flags=registry.preparse(argv), argv=argv)
    enabled = registry.enabled(context)
    if backend.name != "cuda":  # expected off CUDA; Megatron warns once per module otherwise
        warnings.filterwarnings("ignore", message=r".*(transformer[ -]engine|apex)")  # case-insensitive
    arguments_hook.register(patch_manager, registry, context)
    for feature in enabled:
        feature.register_patches(patch_manager, context)
    patch_manager.apply()
    quiet = quiet or env.quiet()
    if not quiet and is_rank0():
        print(summary(enabled), flush=True)
    return context


def feature_registry() -> FeatureRegistry:
    """This run's registry; without ``setup()`` (``ADAPTOR_PATCH=0``), every feature, none applied."""
    from patches import all_features

    return registry if registry is not None else FeatureRegistry(all_features())


def summary(enabled=None) -> str:
    """Backend, enabled features, and every applied patch grouped by the module that owns it."""
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
    """Remove every patch and forget the context, so setup() can run again."""
    global backend, registry, context
    patch_manager.clear()
    backend = registry = context = None


if env.is_on("ADAPTOR_PATCH"):
    setup()
else:
    backend = _detected_backend()
