"""benchmarks/device_check.py, every part of it on CPU: the command that fills the accelerator column of
the backend matrix the day a device is lent must run unchanged then, so each of its parts runs here.

With ``--device cpu`` the "device" runs are the CPU runs (one run per command line), so every curve
gap is 0; what this proves is that every part (start checkpoints, both models, TP=2, FSDP2 against
DDP, fused against unfused, the safetensors round trip, step time and MFU) runs and reads its logs,
and that the table has a row for each. Runs start warm (helpers/warm_launcher.py), with the command
lines and environment the script gives them, two parts at a time (``--jobs 2``) on the two cores.
"""
from __future__ import annotations

import importlib.util
import re

from helpers.megatron_runs import launch
from helpers.paths import ROOT


def test_every_part_runs_on_cpu(capsys):
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "benchmarks" / "device_check.py")
    device_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device_check)

    def warm(args, env, nproc, cwd):
        run = launch("pretrain_gpt.py", args, nproc, env, timeout=600, cwd=cwd)
        return run.returncode, run.output

    status = device_check.main(["--device", "cpu", "--iters", "3", "--bench-iters", "7", "--jobs", "2"], launch=warm)
    table = capsys.readouterr().out
    rows = re.findall(r"^\| (.+?) \| (ok|FAIL|skipped) \| (.*) \|$", table, re.MULTILINE)
    assert status == 0, table
    assert [verdict for _, verdict, _ in rows] == ["ok"] * 7, table
    gaps = [float(m) for m in re.findall(r"max relative gap (\S+)", table)]
    assert len(gaps) == 6 and max(gaps) <= 1e-5, table
    assert re.search(r"ms/iteration \(median after 5\), MFU", table), table
