"""Start entry scripts as torchrun (or plain python) would, from a warm zygote when that is sound.

``start(script, args, nproc=..., launcher="torchrun"|"python")`` returns a :class:`Launched`, a small
Popen: ``pid`` (the run's agent, leader of its own session), ``stdout``/``stderr`` pipes, ``wait``,
``communicate``, ``send_signal``, ``returncode``, plus ``exitcodes`` (one per rank) and
``first_failure`` ((rank, exit code) of the first rank to fail, torchrun's "root cause").

Warm runs fork from helpers/zygote.py, which has imported torch and Megatron once (about 6 s a rank
saved). A run is launched cold, as the user's command line, when ``warm=False``, when the environment
differs from the zygote's in a variable read at import time, or when ``ADAPTOR_TEST_COLD=1`` (the whole
suite cold: the reference the warm suite must equal). Cold torchrun's ranks and root cause are read
from its ChildFailedError report.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from helpers.paths import ROOT
from helpers.processes import free_port, without_launcher

ZYGOTE = Path(__file__).with_name("zygote.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def cold_only() -> bool:
    return os.environ.get("ADAPTOR_TEST_COLD", "") not in ("", "0")


def base_env(extra: dict | None = None) -> dict:
    """This process's environment, one thread per process on the cpu backend, without launcher variables."""
    env = without_launcher(dict(os.environ, OMP_NUM_THREADS="1", ADAPTOR_BACKEND="cpu", PYTHONUNBUFFERED="1"))
    env.pop("ADAPTOR_TEST_COLD", None)
    env.update(extra or {})
    return env


class _Zygote:
    """One zygote process, for one set of import-time variables; started on first use or by ``prestart``."""

    def __init__(self, import_env: dict | None = None) -> None:
        self.import_env = dict(import_env or {})
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._path: str | None = None
        self._ready = threading.Event()
        self.failed: str | None = None

    def prestart(self) -> None:
        with self._lock:
            if self._proc is not None or self.failed:
                return
            STATS["zygotes started"] += 1
            STARTS[self.describe()] = STARTS.get(self.describe(), 0) + 1
            folder = tempfile.mkdtemp(prefix="adaptor-zygote-")
            self._path = os.path.join(folder, "socket")
            self._log = os.path.join(folder, "zygote.log")  # the imports' warnings; ranks write to their own pipes
            with open(self._log, "w") as log:
                self._proc = subprocess.Popen([sys.executable, str(ZYGOTE), self._path], cwd=ROOT, env=self.env(),
                                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
            threading.Thread(target=self._await_ready, args=(self._proc,), daemon=True).start()

    def _await_ready(self, proc: subprocess.Popen) -> None:  # its own reference: stop() clears self._proc
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.wait()
            self.failed = f"zygote did not start: {line}{Path(self._log).read_text()[-3000:]}"
        self._ready.set()

    def connect(self) -> socket.socket | None:
        """A connection to the zygote, or None when it could not start."""
        self.prestart()
        if self.failed:
            return None
        self._ready.wait(300)
        if self.failed or not self._ready.is_set():
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._path)
        except OSError:  # stopped meanwhile (evicted): this run starts cold
            conn.close()
            return None
        return conn

    def describe(self) -> str:
        """Its import-time variables where they differ from the tests' base ("base" when none do)."""
        from helpers.zygote import import_time_variables

        base = import_time_variables(base_env())
        diff = {k: v for k, v in self.import_env.items() if base.get(k) != v}
        diff.update({k: "(unset)" for k in base if k not in self.import_env})
        return " ".join(f"{k}={v}" for k, v in sorted(diff.items())) or "base"

    def env(self) -> dict:
        """The zygote's own environment: the tests' base, with this zygote's import-time variables."""
        from helpers.zygote import import_time_variables

        env = {k: v for k, v in base_env().items() if k not in import_time_variables(base_env())}
        env.update(self.import_env)
        return env

    def stop(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            was_failed, self.failed = self.failed, self.failed or "stopped"  # no restart after this
        if proc is None:
            self._ready.set()
            return
        try:
            if self._ready.wait(1) and not was_failed:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                    conn.connect(self._path)
                    socket.send_fds(conn, [(json.dumps({"stop": True}) + "\n").encode()], [])
            proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        shutil.rmtree(os.path.dirname(self._path), ignore_errors=True)  # its socket and log


class _Zygotes:
    """A zygote per set of import-time variables (the tests' base, the NPU stand-in's PYTHONPATH, ...).

    A set met for the first time gets its own zygote; past ``MAX`` of them the one used least recently
    stops (its runs go on: they are its children's children, not its threads). The suite meets nine
    sets, several of them again after others: with room for four, 13 of its 22 zygote starts (about
    8 s of imports each) were restarts of a stopped one. A zygote holds about 0.8 GB resident, much of
    it torch's shared libraries, so ten fit beside the runs on a 24 GB machine.
    """

    MAX = 10

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple, _Zygote] = {}  # least recently used first

    def for_env(self, env: dict) -> _Zygote:
        from helpers.zygote import import_time_variables

        wanted = import_time_variables(env)
        key = tuple(sorted(wanted.items()))
        with self._lock:
            zygote = self._by_key.pop(key, None) or _Zygote(wanted)
            self._by_key[key] = zygote
            stale = [self._by_key.pop(k) for k in list(self._by_key)[:-self.MAX]]
        for old in stale:
            threading.Thread(target=old.stop, daemon=True).start()
        return zygote

    def prestart(self) -> None:
        self.for_env(base_env()).prestart()

    def socket_for(self, env: dict) -> str | None:
        """The socket of the zygote for ``env``, started if need be; None when there is none."""
        zygote = self.for_env(env)
        conn = zygote.connect()
        if conn is None:
            return None
        conn.close()
        return zygote._path

    def stop(self) -> None:
        with self._lock:
            zygotes = list(self._by_key.values())
        for zygote in zygotes:
            zygote.stop()


ZYGOTES = _Zygotes()
#: What the session's launches cost, printed at its end (conftest.py): a new zygote is ~10 s of imports.
STATS = {"zygotes started": 0, "warm launches": 0, "warm launches in the user's order": 0, "cold launches": 0}
#: How often a zygote was started for each set of import-time variables (a set started twice was evicted).
STARTS: dict[str, int] = {}


class Launched:
    """One launched run: a subset of subprocess.Popen, plus each rank's exit code."""

    def __init__(self, command: list[str], warm: bool):
        self.command = command
        self.warm = warm
        self.user_order = False  # warm, from the zygote that preloads no Megatron
        self.returncode: int | None = None
        self.exitcodes: list[int] | None = None
        self.first_failure: tuple[int, int] | None = None
        self.threads_at_fork: int | None = None
        self.started = time.monotonic()
        self.wall_s: float | None = None
        self.pid: int = 0
        self.stdout = self.stderr = None
        self._popen: subprocess.Popen | None = None
        self._conn: socket.socket | None = None
        self._conn_file = None

    # -- Popen's interface --
    def poll(self) -> int | None:
        if self.returncode is None:
            if self._popen is not None:
                if self._popen.poll() is not None:
                    self._finish_cold()
            elif select.select([self._conn], [], [], 0)[0]:  # the agent's report (or its end) is there
                self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        if self._popen is not None:
            self._popen.wait(timeout)
            self._finish_cold()
        else:
            self._conn.settimeout(timeout)
            try:
                line = self._conn_file.readline()
            except (TimeoutError, socket.timeout):
                raise subprocess.TimeoutExpired(self.command, timeout) from None
            report = json.loads(line) if line else {"exitcodes": [-signal.SIGKILL], "first_failure": None}
            self._finish_warm(report)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Both streams read to their end and the exit status, as Popen.communicate; kills the run on timeout."""
        chunks = {"out": [], "err": []}

        def read(name, stream):
            if stream is not None:
                chunks[name].append(stream.read())

        readers = [threading.Thread(target=read, args=(n, s), daemon=True)
                   for n, s in (("out", self.stdout), ("err", self.stderr))]
        for t in readers:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in readers):
            self.kill_all()
            for t in readers:
                t.join(30)
            self.wait(30)
            raise subprocess.TimeoutExpired(self.command, timeout, output="".join(chunks["out"]),
                                            stderr="".join(chunks["err"]))
        self.wait(None if deadline is None else max(1.0, deadline - time.monotonic()))
        return "".join(chunks["out"]), "".join(chunks["err"])

    def send_signal(self, sig: int) -> None:
        """To the agent (or launcher) and every rank under it, as a node's death or a scheduler would."""
        import psutil

        try:
            tree = [psutil.Process(self.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for process in tree:
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def kill_all(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.send_signal(signal.SIGKILL)

    # -- ends --
    def _finish_warm(self, report: dict) -> None:
        self.exitcodes = report["exitcodes"]
        failure = report.get("first_failure")
        self.first_failure = tuple(failure) if failure else None
        if self.command[1:3] == ["-m", "torch.distributed.run"]:
            self.returncode = 0 if all(code == 0 for code in self.exitcodes) else 1
        else:
            self.returncode = self.exitcodes[0]
        self.wall_s = time.monotonic() - self.started
        self._conn_file.close()
        self._conn.close()

    def _finish_cold(self) -> None:
        self.returncode = self._popen.returncode
        self.wall_s = time.monotonic() - self.started


def torchrun_root_cause(output: str) -> tuple[int, int] | None:
    """(rank, exitcode) of the "Root Cause" entry in torchrun's ChildFailedError report."""
    _, sep, tail = output.partition("Root Cause (first observed failure):")
    if not sep:
        return None
    rank = re.search(r"rank\s*:\s*(\d+)", tail)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", tail)
    return (int(rank.group(1)), int(code.group(1))) if rank and code else None


def command_line(script: str, args, nproc: int, launcher: str, port: int) -> list[str]:
    """What the user would type; a cold launch runs exactly this."""
    if launcher == "torchrun":
        return TORCHRUN + [f"--nproc_per_node={nproc}", f"--master_port={port}", str(script), *map(str, args)]
    assert nproc == 1, "plain python runs one process"
    return [sys.executable, str(script), *map(str, args)]


#: Launches on the user's path (cold, or warm in the user's import order) and in all, per test module.
USER_PATH: dict[str, list[int]] = {}


def _calling_module() -> str | None:
    """The test module whose test (or fixture) makes this launch from the main thread; None from the
    prefetching threads, which run fixtures on behalf of tests that have not started."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    if not current or threading.current_thread() is not threading.main_thread():
        return None
    return current.split("::", 1)[0]


def _first_of_module(module: str | None) -> bool:
    return module is not None and module.startswith("tests/e2e/") and module not in USER_PATH


def _count_user_path(module: str | None, on_user_path: bool) -> None:
    if module is None:
        return
    counts = USER_PATH.setdefault(module, [0, 0])
    counts[0] += on_user_path
    counts[1] += 1


def user_path_summary() -> list[str]:
    """The session's share of launches on the user's path, and the e2e modules with none on it."""
    launches = STATS["warm launches"] + STATS["cold launches"]
    on_path = STATS["cold launches"] + STATS["warm launches in the user's order"]
    e2e = {m: c for m, c in USER_PATH.items() if m.startswith("tests/e2e/")}
    without = sorted(m for m, (user, _) in e2e.items() if not user)
    lines = [f"user's path (import adaptor first, patches through import hooks): {on_path} of {launches} "
             f"launches ({STATS['cold launches']} cold, {STATS["warm launches in the user's order"]} warm in "
             f"the user's order); {len(e2e) - len(without)} of {len(e2e)} e2e modules that launch have one"]
    lines += [f"  no launch on the user's path: {m}" for m in without]
    return lines


def start(script, args=(), *, nproc: int = 1, env: dict | None = None, launcher: str = "torchrun",
          cwd=ROOT, warm: bool = True, merge_stderr: bool = False, code: str | None = None) -> Launched:
    """Launch ``script`` (a path, or ``"-c"`` with ``code``) with ``args`` on ``nproc`` ranks.

    ``env`` is the whole environment (default: :func:`base_env`); a plain-python launch gets no launcher
    variables unless ``env`` sets them, as a user's shell has none.

    The first launch of each e2e test module goes the user's way: from the zygote that preloads no
    Megatron (``import adaptor`` first, its patches waiting on import hooks), or cold where the run's
    import-time variables are not the base ones; so every e2e capability keeps a proof on that path.
    """
    from helpers.zygote import ORDER_VARIABLE, import_time_variables

    env = base_env() if env is None else dict(env)
    module = _calling_module()
    if warm and not cold_only() and _first_of_module(module) and ORDER_VARIABLE not in env:
        if import_time_variables(env) == import_time_variables(base_env()):
            env[ORDER_VARIABLE] = "user"
        else:
            warm = False
    user_order = env.get(ORDER_VARIABLE) == "user"
    port = free_port()
    script = str(script)
    cmd = command_line(script, args, nproc, launcher, port) if script != "-c" else [sys.executable, "-c", code, *args]
    conn = None
    if warm and not cold_only():
        conn = ZYGOTES.for_env(env).connect()
    if conn is None:
        _count_user_path(module, True)
        return _start_cold(cmd, env, cwd, merge_stderr)
    STATS["warm launches"] += 1
    STATS["warm launches in the user's order"] += user_order
    _count_user_path(module, user_order)
    launched = Launched(cmd, warm=True)
    launched.user_order = user_order
    out_r, out_w = os.pipe()
    if merge_stderr:
        err_r, err_w = None, os.dup(out_w)
    else:
        err_r, err_w = os.pipe()
    request = {"script": script, "code": code, "argv": [str(a) for a in args], "env": env, "cwd": str(cwd),
               "nproc": nproc, "launcher": launcher, "master_port": port}
    socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], [out_w, err_w])
    os.close(out_w)
    os.close(err_w)
    conn_file = conn.makefile("r")
    hello = json.loads(conn_file.readline() or '{"refused": "zygote closed the connection"}')
    if "refused" in hello and os.environ.get("ADAPTOR_TEST_LAUNCH_DEBUG"):
        print("warm launch refused:", hello["refused"], file=sys.stderr)
    if "refused" in hello:
        conn_file.close()
        conn.close()
        for fd in (out_r, err_r):
            if fd is not None:
                os.close(fd)
        return _start_cold(cmd, env, cwd, merge_stderr)
    launched.pid = hello["pid"]
    launched.threads_at_fork = hello["threads_at_fork"]
    launched._conn, launched._conn_file = conn, conn_file
    launched.stdout = os.fdopen(out_r, "r", errors="replace")
    launched.stderr = None if err_r is None else os.fdopen(err_r, "r", errors="replace")
    return launched


def _start_cold(cmd, env, cwd, merge_stderr) -> Launched:
    STATS["cold launches"] += 1
    launched = Launched(cmd, warm=False)
    launched._popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    launched.pid = launched._popen.pid
    launched.stdout, launched.stderr = launched._popen.stdout, launched._popen.stderr
    return launched


def finish_cold_report(launched: Launched, output: str) -> None:
    """Ranks' exit codes of a cold run, as far as the launcher's output tells them."""
    if launched.warm:
        return
    if launched.command[1:3] == ["-m", "torch.distributed.run"]:
        launched.first_failure = torchrun_root_cause(output)
    else:
        launched.exitcodes = [launched.returncode]
        launched.first_failure = None if launched.returncode == 0 else (0, launched.returncode)
