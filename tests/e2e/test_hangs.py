"""A rank that dies or stalls ends the whole run within a bounded time, and the output says which and where.

Both cases train the tiny Qwen3 on two gloo ranks under torchrun, and act on rank 1 once
iteration 3 is logged:

* SIGKILL: torchrun ends rank 0 at once; its report names rank 1 and signal 9;
* SIGSTOP (a rank that hangs without dying): rank 0 blocks in its next collective until
  ``--distributed-timeout-seconds`` (10 s here) passes, then exits with one line naming
  itself, the collective and its caller; torchrun ends the stopped rank. Once rank 0 has printed
  its line the stopped rank is continued, so that it takes torchrun's SIGTERM at once, as a
  rank hung in a collective or a kernel does (a stopped one would hold torchrun 30 s more);
  continued, it has itself waited past the timeout and may print its own line first.

The two runs go side by side: the stalled one mostly waits.

Bounds are generous multiples of the timeout (a loaded CI machine): the point is that the
run ends by itself, not how fast.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from helpers.megatron_runs import TINY_QWEN3, TORCHRUN, side_by_side
from helpers.one_line_errors import PREFIX, base_env, error_lines
from helpers.paths import ROOT
from helpers.prefetch import prefetched
from helpers.processes import descendants, free_port

SCRIPT = str(ROOT / "pretrain_gpt.py")
TIMEOUT_S = 10
ARGS = TINY_QWEN3 + ["--train-iters", "100000", "--distributed-timeout-seconds", str(TIMEOUT_S)]


def rank_pid(launcher: int, rank: int) -> int | None:
    """The worker of ``rank``: the first of the launcher's descendants with that RANK (its own children inherit it)."""
    for pid in descendants(launcher):
        try:
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    return None


def run_and_disturb(tmp_path: Path, sig: int) -> tuple[subprocess.Popen, str, float, int]:
    """(process, output, seconds from the signal to the end of the run, number of output lines read
    before a stopped rank was continued)."""
    cmd = TORCHRUN + ["--nproc_per_node=2", f"--master_port={free_port()}", SCRIPT, *ARGS]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    end_all = lambda: os.killpg(proc.pid, signal.SIGKILL)  # noqa: E731
    timer = threading.Timer(400, end_all)
    timer.start()
    lines, sent, victim = [], None, None
    continued_at = None
    try:
        for line in proc.stdout:
            lines.append(line)
            if sent is None and re.search(r"iteration\s+3/", line):
                victim = rank_pid(proc.pid, 1)
                assert victim is not None, "rank 1 not found"
                os.kill(victim, sig)
                sent = time.monotonic()
            elif sig == signal.SIGSTOP and victim and line.startswith("megatron-adaptor: error:"):
                # rank 0 gave up and leaves; torchrun then ends the others with SIGTERM, which a hung rank
                # obeys at once but a stopped one only once continued (else torchrun waits 30 s, then
                # SIGKILLs it). Continued, it meets a dead peer and would wait its error grace (10 s).
                os.kill(victim, signal.SIGCONT)
                continued_at, victim = len(lines), None
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            end_all()
        else:
            try:  # a stopped worker torchrun could not end would be left behind
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert sent is not None, "".join(lines)[-3000:]
    return proc, "".join(lines), time.monotonic() - sent, len(lines) if continued_at is None else continued_at


@prefetched
def disturbed(tmp_path_factory):
    """Both runs, side by side: the stalled one spends most of its time waiting out the timeout."""
    signals = {"kill": signal.SIGKILL, "stall": signal.SIGSTOP}
    runs = [lambda name=name, sig=sig: run_and_disturb(tmp_path_factory.mktemp(name), sig) for name, sig in signals.items()]
    return dict(zip(signals, side_by_side(*runs)))


def test_a_killed_rank_ends_the_run(disturbed):
    proc, output, took, _ = disturbed["kill"]
    assert proc.returncode != 0
    assert took < 120, f"the run took {took:.0f} s to end after rank 1 died"
    assert re.search(r"rank\s*:\s*1", output) and re.search(r"exitcode\s*:\s*-9", output), output[-3000:]


def test_a_stalled_rank_ends_the_run_with_one_line(disturbed):
    proc, output, took, continued_at = disturbed["stall"]
    assert proc.returncode != 0
    assert took < TIMEOUT_S + 120, f"the run took {took:.0f} s to end after rank 1 stalled"
    before = "".join(output.splitlines(keepends=True)[:continued_at])
    lines = error_lines(before)
    assert len(lines) == 1, f"{lines}\n{output[-3000:]}"
    # Continued, rank 1 has itself waited past the timeout, and may say so before torchrun's SIGTERM lands.
    later = error_lines(output)[1:]
    assert all(line.startswith(f"{PREFIX} rank 1: ") for line in later), f"{later}\n{output[-3000:]}"
    for text in ("rank 0", "torch.distributed.", f"timed out after {TIMEOUT_S:g} s", "stalled or died"):
        assert text in lines[0], lines[0]
