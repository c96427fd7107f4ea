"""Child processes: free ports, environments, Python snippets and tools run as subprocesses."""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

from helpers.paths import ROOT, TESTS, TOOLS

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    """A rendezvous port no other launch (in this suite, beside it, or the kernel) takes first."""
    from adaptor.rendezvous import rendezvous_port
    return rendezvous_port()


def child_env(base: dict | None = None, **extra: str) -> dict:
    """``base`` (default: this process's environment) with one thread per process on the cpu backend, then ``extra``."""
    env = dict(os.environ if base is None else base)
    env.update(OMP_NUM_THREADS="1", ADAPTOR_BACKEND="cpu")
    env.update(extra)
    return env


def without_launcher(env: dict) -> dict:
    """``env`` without torchrun's rendezvous variables, as a user's shell would have it."""
    for name in LAUNCHER_VARIABLES:
        env.pop(name, None)
    return env


def run_child(code: str, *argv, env: dict, timeout: float = 300, cwd=ROOT, warm: bool = True):
    """``python -c code argv...`` in the repository root, environment ``env`` as given: a record with
    ``returncode``, ``stdout`` and ``stderr``. Warm unless ``warm=False`` (a test of a fresh interpreter's
    imports must say so)."""
    from helpers.megatron_runs import finish
    from helpers.warm_launcher import start

    return finish(start("-c", [str(a) for a in argv], env=dict(env), launcher="python", cwd=cwd, warm=warm,
                        code=code), timeout)


def tagged_json(output: str, tag: str = "FACTS"):
    """The JSON after ``tag`` on the first output line that starts with it (a child's one-line report)."""
    return json.loads(next(line for line in output.splitlines() if line.startswith(tag))[len(tag):])


_TWO_RANKS_MAIN = r"""
if __name__ == "__main__":
    import json as _json, tempfile as _tempfile
    import torch.multiprocessing as _mp
    _store = _tempfile.mktemp()
    with _mp.Manager() as _manager:
        _results = _manager.dict()
        _mp.start_processes(rank_main, args=(_store, _results), nprocs=2, start_method="fork")
        print("FACTS" + _json.dumps(dict(_results)))
"""


def two_gloo_ranks(code: str, env: dict, timeout: float = 300) -> dict:
    """Run ``code``'s ``rank_main(rank, store, results)`` on two forked ranks (their gloo group meets at
    the file ``store``) in a fresh interpreter; what each put in ``results[rank]``, keyed "0" and "1"."""
    out = run_child(code + _TWO_RANKS_MAIN, env=env, timeout=timeout, warm=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return tagged_json(out.stdout)


def tool_command(name: str, *args) -> list[str]:
    """The command line of ``tools/<name>`` with ``args``."""
    return [sys.executable, str(TOOLS / name), *map(str, args)]


def run_tool(name: str, *args, timeout: float = 300, warm: bool = True, cwd=None, env: dict | None = None):
    """``tools/<name> args`` as a user runs it (``python tools/<name> ...``, environment ``env`` or this
    process's), to its end: a record with ``returncode``, ``stdout`` and ``stderr``.

    Warm unless ``warm=False`` (helpers/warm_launcher.py); the distributed workers a tool starts go
    through ``ADAPTOR_TORCHRUN``, which a warm run points at the same zygote (helpers/warm_torchrun.py).
    """
    from helpers.megatron_runs import finish
    from helpers.warm_launcher import start

    env = dict(os.environ if env is None else env)
    if warm:
        env = warm_torchrun_env(env)
    return finish(start(TOOLS / name, [str(a) for a in args], env=env, launcher="python", cwd=cwd or os.getcwd(),
                        warm=warm), timeout)


def warm_torchrun_env(env: dict) -> dict:
    """``env`` with ``ADAPTOR_TORCHRUN`` pointed at a zygote of the session (helpers/warm_torchrun.py), for
    a tool or example script that starts its workers through it; ``env`` itself when runs start cold."""
    from helpers.warm_launcher import ZYGOTES, cold_only

    socket_path = None if cold_only() else ZYGOTES.socket_for(env)
    if not socket_path:
        return dict(env)
    return dict(env, ADAPTOR_TORCHRUN=f"{sys.executable} {TESTS / 'helpers' / 'warm_torchrun.py'}",
                ADAPTOR_TEST_ZYGOTE_SOCKET=socket_path)


def import_tool(name: str):
    """The module ``tools/<name>.py``, imported into this process (its ``main(argv)`` runs in-process)."""
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    return importlib.import_module(name)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, read from /proc; children come before grandchildren."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop(0)
        children = [child for child, p in parents.items() if p == parent]
        found += children
        frontier += children
    return found
