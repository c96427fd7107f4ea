"""The one megatron-core version the patches are written against.

Patches address upstream functions by dotted path and often depend on their
bodies; against another release they could silently do the wrong thing, so a
mismatch stops at import with a line that names the supported version.
"""
from __future__ import annotations

from importlib import metadata

SUPPORTED_MEGATRON_CORE = "0.19.2"


def installed_megatron_core() -> str | None:
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def check_megatron_version(found: str | None = None) -> None:
    from adaptor.errors import fail

    found = installed_megatron_core() if found is None else found
    if found is None:
        fail(f"megatron-core is not installed; megatron-adaptor needs megatron-core=={SUPPORTED_MEGATRON_CORE}")
    if found != SUPPORTED_MEGATRON_CORE:
        fail(
            f"megatron-adaptor supports megatron-core=={SUPPORTED_MEGATRON_CORE} only, found {found}; "
            f"install it with: pip install megatron-core=={SUPPORTED_MEGATRON_CORE}"
        )
