"""What the adaptor tells the user during a run, on rank 0.

Two kinds of line:

* :func:`notice` — something about this run's settings the user must see: a flag mapped, not
  applied, or a slower path taken. Always printed.
* :func:`say` — progress a log reader may want (the kernels in use, the launch). Silenced by
  ``ADAPTOR_QUIET``, like the start-up summary.

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
    import adaptor

    say_once(f"{what}: {kernels[adaptor.backend.name]} in use", key=what)
