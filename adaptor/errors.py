"""One-line fatal errors for users of the command line."""
from __future__ import annotations

import os
import sys

PREFIX = "megatron-adaptor: error: "


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def fail(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
    """Print ``message`` as one line (rank 0 only under torchrun) and exit with ``code``.

    Every rank exits; only rank 0 prints, so a torchrun of N processes shows
    the reason once instead of N times.
    """
    if is_rank0():
        print(PREFIX + " ".join(str(message).split()), file=sys.stderr, flush=True)
    raise SystemExit(code)
