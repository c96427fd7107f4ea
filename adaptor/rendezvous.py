"""A port for torchrun's rendezvous store that nothing else on the machine will take first.

Asking the kernel for a free port (bind to port 0, close, hand the number on) leaves a window
before rank 0 listens on it. The kernel draws that number from its ephemeral range, the same
range every outgoing connection and every gloo listener draws from, so a busy machine (a
multi-process run beside this one opens dozens of connections) can take it in between, and rank 0
fails with EADDRINUSE. This module hands out ports *below* the ephemeral range, which the kernel
never assigns on its own, and reserves each with a lock file so that processes picking ports
at the same moment (tools, test workers, two checkouts' suites) never pick the same one.
Standard library only: tools import it before torch.
"""
from __future__ import annotations

import collections
import fcntl
import os
import socket
import tempfile
from pathlib import Path

# Locks of the ports this process handed out most recently. A port is bound within seconds of
# being handed out, and while bound it fails the bind check of every other picker, so the lock
# only needs to outlive that window; older locks are closed to keep file descriptors bounded.
_HELD: collections.deque = collections.deque()
_HOLD = 64
_cursor: int | None = None
_LOCK_DIR = Path(tempfile.gettempdir()) / "adaptor-rendezvous-ports"
_LOW_FLOOR = 10000       # below this, ports are commonly configured services'
_MIN_SPAN = 1000


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int] | None:
    """The kernel's (low, high) range for ports it assigns itself, or None where it is not readable."""
    try:
        low, high = (int(v) for v in Path(path).read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def candidate_span(ephemeral: tuple[int, int] | None) -> range | None:
    """Ports outside the kernel's ephemeral range to pick from: below it, else above it, else None."""
    if ephemeral is None:
        return None
    low, high = ephemeral
    if low - _LOW_FLOOR >= _MIN_SPAN:
        return range(_LOW_FLOOR, low)
    if 65535 - high >= _MIN_SPAN:
        return range(high + 1, 65536)
    return None


def _bindable(port: int) -> bool:
    """Nothing holds ``port`` on any address now (a socket in TIME_WAIT counts as holding it)."""
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _reserve(port: int) -> bool:
    """Lock ``port``'s file for this process; False if another process holds it. The directory is shared
    by every user, as /tmp is (sticky, world-writable), and a lock needs only read access to the file;
    where neither works the port goes unreserved (still outside the kernel's range, still bind-checked)."""
    try:
        try:
            _LOCK_DIR.mkdir()
            os.chmod(_LOCK_DIR, 0o1777)
        except FileExistsError:
            pass
        fd = os.open(_LOCK_DIR / str(port), os.O_CREAT | os.O_RDONLY, 0o644)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _HELD.append(fd)
    while len(_HELD) > _HOLD:
        os.close(_HELD.popleft())
    return True


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous_port() -> int:
    """A port for ``--master_port``: outside the ephemeral range, reserved against other pickers,
    bindable now, and not handed out before by this process until the whole span has been used.
    Falls back to the kernel's choice where no such span exists (an unusual port configuration)."""
    global _cursor
    span = candidate_span(ephemeral_range())
    if span is None:
        return _kernel_port()
    if _cursor is None:  # processes start at different places, so they rarely contend for a lock
        _cursor = (os.getpid() * 7919) % len(span)
    for _ in range(len(span)):
        port = span[_cursor]
        _cursor = (_cursor + 1) % len(span)
        if _reserve(port) and _bindable(port):
            return port
    return _kernel_port()
