"""Slow fixtures computed on a background thread before their first test asks for them.

The e2e tier is bound by process start-up (each pretrain_gpt.py process spends ~10 s of one core
importing and initialising before it trains), and many tests keep only one of the two cores busy:
a one-process run, a one-line error, a child interpreter. A fixture declared with ``@prefetched``
(instead of ``@pytest.fixture``) is started, in the order the selected tests will need it, on one
background thread as soon as collection ends, so that its runs use the core those tests leave idle.
Its value is the same as before: the function is called once, with the same arguments; a test that
asks for it before the background thread got there computes it itself (once, whoever asks first);
an exception raised while computing it (a failed assertion, a skip) is raised to every test that
uses it, as from any fixture.

What such a function may do: start subprocesses, read and write files under its own temporary
directories. What it may not do: anything in this process's torch or Megatron state (global RNG,
process groups), since tests run in this process at the same time. Its parameters may be
``tmp_path_factory``, ``shared_runs`` (helpers.megatron_runs.SHARED_RUNS) and other prefetched
fixtures of the same module.
"""
from __future__ import annotations

import inspect
import threading
import time
from concurrent.futures import Future

import pytest

from helpers.megatron_runs import SHARED_RUNS

_BUILTIN = {"tmp_path_factory", "shared_runs"}


class _Prefetcher:
    def __init__(self) -> None:
        self.functions: dict[tuple[str, str], tuple] = {}  # (module, fixture name) -> (function, parameters)
        self.futures: dict[tuple[str, str], Future] = {}
        self.lock = threading.Lock()
        self.tmp_path_factory = None
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        # Seconds computing on the background thread / in tests, and tests' waits for the background thread.
        self.seconds = {"background": 0.0, "in tests": 0.0, "waited for": 0.0}

    def value(self, key):
        """The fixture's value: computed by whoever asks first, waited for by everyone else."""
        with self.lock:
            future = self.futures.get(key)
            owner = future is None
            if owner:
                future = self.futures[key] = Future()
        t0 = time.monotonic()
        if owner:
            function, parameters = self.functions[key]
            try:
                future.set_result(function(**{name: self._argument(key[0], name) for name in parameters}))
            except BaseException as exc:  # noqa: BLE001  (pytest.skip/fail too: raised to each test that asks)
                future.set_exception(exc)
        try:
            return future.result()
        finally:
            background = threading.current_thread() is self.thread
            kind = ("background" if background else "in tests") if owner else (None if background else "waited for")
            if kind:
                self.seconds[kind] += time.monotonic() - t0

    def _argument(self, module, name):
        if name == "tmp_path_factory":
            return self.tmp_path_factory
        if name == "shared_runs":
            return SHARED_RUNS
        return self.value((module, name))

    def start(self, keys) -> None:
        keys = [k for k in keys if k not in self.futures]
        if not keys:
            return

        def work():
            for key in keys:
                if self.stopping.is_set():
                    return
                try:
                    self.value(key)
                except BaseException:  # noqa: BLE001  (kept in the future; the tests that use it report it)
                    pass

        self.thread = threading.Thread(target=work, name="prefetch", daemon=True)
        self.thread.start()

    def summary(self) -> str:
        """Where the prefetched fixtures' time went: a background thread that tests keep waiting for is the
        bottleneck; one that rarely is has room for more."""
        return (f"prefetched fixtures: {len(self.futures)} computed, "
                + ", ".join(f"{v:.0f} s {k}" for k, v in self.seconds.items()))

    def stop(self, timeout: float = 600) -> None:
        """No new work; wait for the fixture being computed (its processes must not outlive the session)."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout)


PREFETCH = _Prefetcher()


def prefetched(function=None, *, scope: str = "module"):
    """``@pytest.fixture(scope=scope)`` whose value a background thread may compute ahead of its tests."""

    def declare(function):
        key = (function.__module__, function.__name__)
        parameters = list(inspect.signature(function).parameters)
        for name in parameters:
            if name not in _BUILTIN and (function.__module__, name) not in PREFETCH.functions:
                raise TypeError(f"@prefetched {function.__name__}: parameter {name!r} is neither "
                                f"{', '.join(sorted(_BUILTIN))} nor a prefetched fixture declared above it")
        PREFETCH.functions[key] = (function, parameters)

        def fixture(tmp_path_factory):
            PREFETCH.tmp_path_factory = PREFETCH.tmp_path_factory or tmp_path_factory
            return PREFETCH.value(key)

        fixture.__doc__ = function.__doc__
        return pytest.fixture(scope=scope, name=function.__name__)(fixture)

    return declare if function is None else declare(function)


def start_for(session) -> None:
    """Start the prefetched fixtures the selected tests use, in the order the tests will ask for them."""
    option = session.config.option
    if option.collectonly or getattr(option, "setupplan", False) or not PREFETCH.functions:
        return
    PREFETCH.tmp_path_factory = session.config._tmp_path_factory  # what the tmp_path_factory fixture returns
    keys = []
    for item in session.items:
        module = getattr(getattr(item, "module", None), "__name__", None)
        for name in getattr(item, "fixturenames", ()):
            key = (module, name)
            if key in PREFETCH.functions and key not in keys:
                keys.append(key)
    PREFETCH.start(keys)
