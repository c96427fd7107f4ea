"""What the stand-in was asked to do: ``calls`` as ``(name, args, kwargs)``, ``counts`` per name.

With ``STANDIN_NPU_CALL_LOG=prefix`` (whole training runs) only the counts are kept, so that no
activation stays referenced, and each process writes them to ``prefix.<pid>.json`` at exit.
"""
from __future__ import annotations

import atexit
import json
import os

calls: list[tuple[str, tuple, dict]] = []
counts: dict[str, int] = {}
_LOG = os.environ.get("STANDIN_NPU_CALL_LOG")


def record(name: str, args=(), kwargs=None) -> None:
    counts[name] = counts.get(name, 0) + 1
    if not _LOG:
        calls.append((name, tuple(args), dict(kwargs or {})))


def _write_counts() -> None:
    with open(f"{_LOG}.{os.getpid()}.json", "w") as f:
        json.dump(counts, f)


if _LOG:
    atexit.register(_write_counts)
