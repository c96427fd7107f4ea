"""Every Megatron-LM functional-test case through tools/megatron_cases/run.py, its launches warm.

    python benchmarks/megatron_cases.py [run.py options, e.g. --status FILE]
    python benchmarks/megatron_cases.py --merge gpt/NAME moe/NAME ...   # those cases again, the rest kept

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

    import json

    named = set(argv) & set(json.loads((ROOT / "tools" / "megatron_cases" / "cases.json").read_text())["cases"])
    proc = run_tool("megatron_cases/run.py", *([] if named else ["--all"]), "--out",
                    ROOT / "benchmarks" / "results" / "megatron_cases.json", "--docs", *argv, timeout=6 * 3600, cwd=ROOT)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr[-5000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
