"""What the adaptor tells the user during a run: every line of ours goes through here.

Three kinds of line, all prefixed ``[megatron-adaptor]``:

* :func:`notice` — something about this run's settings the user must see: a flag mapped, not
  applied, or a slower path taken. Always printed, on rank 0.
* :func:`say` — progress a log reader may want (the kernels in use, the launch). Silenced by
  ``ADAPTOR_QUIET``, like the start-up summary.
* :func:`every_rank` — a fact that differs per rank (its memory), printed by each rank.

The ``*_once`` forms print a line the first time its key is seen in this process (Megatron may
parse arguments twice; an operator runs every step).
"""
from __future__ import annotations

from adaptor import env
from adaptor.errors import is_rank0

PREFIX = "[megatron-adaptor]"
_said: set[str] = set()


def notice(text: str) -> None:
    """Print one line on rank 0."""
    if is_rank0():
        every_rank(text)


def every_rank(text: str) -> None:
    """Print one line on this rank (the text names the rank)."""
    print(f"{PREFIX} {text}", flush=True)


def say(text: str) -> None:
    """Print one line on rank 0 unless ``ADAPTOR_QUIET`` is set."""
    if not env.quiet():
        notice(text)


def _first(key: str) -> bool:
    if key in _said:
        return False
    _said.add(key)
    return True


def notice_once(text: str, key: str | None = None) -> None:
    if _first(text if key is None else key):
        notice(text)


def say_once(text: str, key: str | None = None) -> None:
    if _first(text if key is None else key):
        say(text)


def announce_kernel(what: str, kernels: dict[str, str]) -> None:
    """Say once which kernel an operator runs on this backend, so a log shows the fused path really ran.

    ``kernels`` maps backend name (npu, cuda, cpu) to the kernel's name.
    """
    from adaptor import run_state

    say_once(f"{what}: {kernels[run_state.backend().name]} in use", key=what)
