"""Every Megatron-LM functional-test case through tools/megatron_cases/run.py, its launches warm.

    python benchmarks/megatron_cases.py [run.py options, e.g. --status FILE]

The same tool a user runs (``python tools/megatron_cases/run.py --all``), with its ``torchrun`` served by
the test suite's zygote (tests/helpers/warm_torchrun.py, whose runs equal cold ones:
tests/e2e/test_warm_launcher.py), which saves each launch its interpreter start and imports. It
writes benchmarks/results/megatron_cases.json and regenerates docs/migrating.md's table.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str]) -> int:
    from helpers.processes import run_tool

    proc = run_tool("megatron_cases/run.py", "--all", "--out", ROOT / "benchmarks" / "results" / "megatron_cases.json",
                    "--docs", *argv, timeout=6 * 3600, cwd=ROOT)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr[-5000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
