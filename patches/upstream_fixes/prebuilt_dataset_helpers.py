"""Use the prebuilt dataset index helpers instead of compiling them.

Upstream: ``megatron.core.datasets.utils.compile_helpers`` runs
``make -C megatron/core/datasets`` on rank 0 before building datasets. The
PyPI wheel ships no Makefile (so ``make`` fails and Megatron exits), but it
does ship the compiled ``helpers_cpp`` extension. When that extension imports
there is nothing to compile; otherwise we fall back to the original.
Applies on every backend: the wheel lacks the Makefile on CUDA hosts too.

Remove when: the megatron-core wheel ships ``megatron/core/datasets/Makefile``, or
``compile_helpers`` (called from ``megatron.training.initialize._compile_dependencies``) skips
``make`` when ``helpers_cpp`` already imports. Not fixed upstream as of megatron-core 0.19.2 nor on
Megatron-LM main (d98e8a64, 2026-08-22): its MANIFEST.in lists no Makefile and ``compile_helpers``
runs ``make`` unconditionally. No upstream issue or PR found.
"""
from __future__ import annotations

import importlib

from adaptor.features import Feature

OWNER = __name__


def _compile_helpers(wrapped, instance, call_args, kwargs):
    try:
        importlib.import_module("megatron.core.datasets.helpers_cpp")
    except ImportError:
        return wrapped(*call_args, **kwargs)
    return None


class PrebuiltDatasetHelpers(Feature):
    name = "prebuilt_dataset_helpers"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.core.datasets.utils.compile_helpers", _compile_helpers, OWNER)
