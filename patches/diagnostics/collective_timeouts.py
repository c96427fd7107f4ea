"""When a rank stalls, the others stop within a bounded time, with one line naming rank and collective.

A dead rank is torchrun's business; a stalled one leaves the others blocked in a collective until
the process-group timeout (``--distributed-timeout-minutes``, passed by Megatron to
``torch.distributed.init_process_group`` and every group), which then raises a traceback screens
long. ``--distributed-timeout-seconds S`` sets that timeout in seconds (small values for tests and
fast-failing jobs), and ``megatron.training.training.pretrain`` is wrapped so a collective timeout is
one line, status 1, naming the rank, the innermost ``torch.distributed`` call and its Megatron caller.
A connection a peer refused or reset is a dead peer, not a timeout, and its line says so.
"""
from __future__ import annotations

import os
import re
import traceback

from adaptor.errors import fail
from adaptor.features import ArgumentError, Feature

OWNER = __name__
_TIMEOUT = re.compile(r"timed out|timeout|Timeout", re.IGNORECASE)
_LOST_PEER = re.compile(r"Connection refused|Connection reset|Connection closed by peer|Broken pipe", re.IGNORECASE)
_DIST = f"{os.sep}torch{os.sep}distributed{os.sep}"


def _plumbing(frame) -> bool:
    """Frames that only pass a call along: torch.distributed itself, context managers, wrappers."""
    name = os.path.basename(frame.filename)
    return _DIST in frame.filename or name in ("contextlib.py", "functools.py", "wrappers.py") or "wrapt" in frame.filename


def describe(exc: BaseException) -> tuple[str, str]:
    """(collective, caller): where the traceback first enters torch.distributed, and the code that called it."""
    frames = traceback.extract_tb(exc.__traceback__)
    collective, caller = "a collective", "training"
    for index, frame in enumerate(frames):
        if _DIST in frame.filename and "c10d_logger" not in frame.filename:
            collective = f"torch.distributed.{frame.name}"
            outer = [f for f in frames[:index] if not _plumbing(f)]
            if outer:
                caller = f"{outer[-1].name} ({os.path.basename(outer[-1].filename)}:{outer[-1].lineno})"
            break
    return collective, caller


def is_collective_timeout(exc: BaseException) -> bool:
    # torch.distributed's DistBackendError and DistError are RuntimeErrors; gloo raises plain ones.
    return isinstance(exc, RuntimeError) and bool(_TIMEOUT.search(str(exc)))


def is_lost_peer(exc: BaseException) -> bool:
    """A peer's connection refused or reset: it died, it did not wait out any timeout (gloo words a
    refused connect as "timed out connecting" after a few quick retries)."""
    return isinstance(exc, RuntimeError) and bool(_LOST_PEER.search(str(exc)))


def _pretrain(wrapped, instance, call_args, kwargs):
    try:
        return wrapped(*call_args, **kwargs)
    except Exception as exc:  # noqa: BLE001  (only timeouts are turned into a line; the rest re-raise)
        if not is_collective_timeout(exc) and not is_lost_peer(exc):
            raise
        from megatron.training import get_args

        collective, caller = describe(exc)
        minutes = get_args().distributed_timeout_minutes
        who = "rank 0: " if os.environ.get("RANK", "0") == "0" else ""  # other ranks' lines carry it already
        if is_lost_peer(exc):
            fail(f"{who}{collective} in {caller} could not reach another rank, or lost it (the connection was refused "
                 f"or reset: that rank died; its own output, or its node's, says why)", code=1)
        fail(f"{who}{collective} in {caller} timed out after {minutes * 60:g} s waiting for the other ranks "
             f"(one of them stalled or died; its own output says which); if a step can legitimately take longer, "
             f"raise --distributed-timeout-minutes", code=1)


class CollectiveTimeouts(Feature):
    name = "collective_timeouts"

    def add_arguments(self, group) -> None:
        group.add_argument("--distributed-timeout-seconds", type=float, default=None,
                           dest="distributed_timeout_seconds", metavar="S",
                           help="how long a collective waits for the other ranks before the run stops with one "
                                "line naming the rank and the collective (replaces --distributed-timeout-minutes)")

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.pretrain", _pretrain, OWNER)

    def validate(self, args, ctx) -> None:
        seconds = args.distributed_timeout_seconds
        if seconds is None:
            return
        if seconds <= 0:
            raise ArgumentError(f"--distributed-timeout-seconds {seconds:g}: must be positive")
        if "distributed_timeout_minutes" in ctx.explicit:
            raise ArgumentError("--distributed-timeout-seconds and --distributed-timeout-minutes both set the "
                                "collective timeout; pass one")
        args.distributed_timeout_minutes = seconds / 60
