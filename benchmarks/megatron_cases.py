"""Every Megatron-LM functional-test case through tools/megatron_cases/run.py, its launches warm.

    python benchmarks/megatron_cases.py [run.py options, e.g. --status FILE]

The same tool a user runs (``python tools/megatron_cases/run.py --all``), with its ``torchrun`` served by
the test suite's zygote (tests/helpers/warm_torchrun.py, whose runs equal cold ones:
tests/e2e/test_warm_launcher.py), so the whole set takes minutes instead of an hour on 2 cores. It
writes benchmarks/results/megatron_cases.json and regenerates docs/migrating.md's table.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str]) -> int:
    from helpers.warm_launcher import ZYGOTES, base_env

    env = base_env()
    socket_path = ZYGOTES.socket_for(env)
    if socket_path:
        env.update(ADAPTOR_TORCHRUN=f"{sys.executable} {ROOT / 'tests' / 'helpers' / 'warm_torchrun.py'}",
                   ADAPTOR_TEST_ZYGOTE_SOCKET=socket_path)
    command = [sys.executable, str(ROOT / "tools" / "megatron_cases" / "run.py"), "--all",
               "--out", str(ROOT / "benchmarks" / "results" / "megatron_cases.json"), "--docs", *argv]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
