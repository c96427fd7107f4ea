"""One-line fatal errors for users of the command line.

Under torchrun every rank hits the same command-line error, and only rank 0
prints it. torchrun, however, stops all workers (SIGTERM) as soon as any one
of them exits, so a rank that reached the error first used to kill rank 0
before it printed: with rank 0 starting one second late, a bad
``--tensor-model-parallel-size`` ended in torchrun's ``ChildFailedError``
report ("exitcode: 2") and no reason at all. Ranks other than 0 therefore
wait a grace period (``ADAPTOR_ERROR_GRACE_S``, default 10 s) before they
exit. When rank 0 fails too, torchrun ends the waiting ranks as soon as rank
0 exits, so the wait costs nothing; when rank 0 does not fail (a problem only
some ranks see, such as a data file missing on one node), the waiting rank
prints the reason itself after the grace period, naming its rank.
"""
from __future__ import annotations

import os
import sys
import time

from adaptor import env

PREFIX = "megatron-adaptor: error: "


class ArgumentError(ValueError):
    """A command-line problem reported to the user as one line."""


GRACE_ENV = "ADAPTOR_ERROR_GRACE_S"
DEFAULT_GRACE_S = 10.0


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def grace_seconds() -> float:
    try:
        return max(0.0, float(env.value(GRACE_ENV) or DEFAULT_GRACE_S))
    except ValueError:
        return DEFAULT_GRACE_S


def fail(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
    """Print ``message`` as one line (rank 0 only under torchrun) and exit with ``code``.

    Every rank exits; rank 0 prints at once, so a torchrun of N processes
    shows the reason once instead of N times. Other ranks first wait
    :func:`grace_seconds` so they cannot get rank 0 killed before it prints
    (see the module docstring); a rank still alive after that prints the
    reason with its rank.
    """
    text = " ".join(str(message).split())
    if not is_rank0():
        time.sleep(grace_seconds())
        text = f"rank {os.environ.get('RANK')}: {text}"
    print(PREFIX + text, file=sys.stderr, flush=True)
    raise SystemExit(code)
