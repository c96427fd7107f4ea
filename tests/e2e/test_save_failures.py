"""A checkpoint save that fails keeps the previous checkpoint, says so in one line, and never goes unnoticed.

The failure is real: the processes run under a file-size limit (``RLIMIT_FSIZE``, what
``ulimit -f`` sets), so the kernel refuses the write of a rank file past the limit with
``EFBIG`` exactly where a full disk would refuse it with ``ENOSPC``; both reach the writer
as an ``OSError``. No root, no special filesystem. The limit holds for every file the
processes write, so torch.compile (whose C++ compiler writes large files, and does not
ignore ``SIGXFSZ`` as Python does) is off in these runs: ``TORCH_COMPILE_DISABLE=1``.

* default policy (``--save-failure-retries 0``), DP=2 under torchrun: the run that resumes
  from a good checkpoint and fails its next save exits with status 1 and one line naming the
  error and the kept checkpoint; that checkpoint is byte-for-byte unchanged, nothing of the
  failed save is left, and a later run resumes from it;
* ``--save-failure-retries``, ``--async-save``: saves fail while the limit holds (one line
  each), training goes on, and once the limit is lifted the next save succeeds and the run
  ends with status 0 on a complete last checkpoint.
"""
from __future__ import annotations

import hashlib
import os
import re
import resource
import signal
import subprocess
import sys
import threading
from pathlib import Path

from helpers.megatron_runs import TINY_QWEN3, TORCHRUN, run_pretrain
from helpers.megatron_runs import tail as megatron_tail
from helpers.one_line_errors import base_env, child_frames, error_lines
from helpers.paths import ROOT
from helpers.processes import descendants, free_port

SCRIPT = str(ROOT / "pretrain_gpt.py")
LIMIT = 2**20  # bytes: the common state and each tensor handed to the async worker fit; a rank file (1.7-3.4 MB) does not
FORMAT = ["--ckpt-format", "safetensors"]


def digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def limited(nbytes: int):
    """Soft limit only: the hard one stays, so the test may lift it later without privileges."""
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return apply


def torchrun(nproc: int, args: list[str], cwd: Path, preexec=None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = base_env(TORCH_COMPILE_DISABLE="1")
    cmd = TORCHRUN + [f"--nproc_per_node={nproc}", f"--master_port={free_port()}", SCRIPT, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec)


def tail(proc) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-50:])


def test_failed_save_exits_and_keeps_the_previous_checkpoint(tmp_path):
    save = tmp_path / "ckpt"
    common = TINY_QWEN3 + FORMAT + ["--save", str(save), "--load", str(save), "--save-interval", "2",
                                    "--train-iters", "6"]
    first = run_pretrain(common + ["--exit-interval", "2"], nproc=2)  # no limit: warm, as any run
    assert first.returncode == 0, megatron_tail(first.output)
    kept = digest(save / "iter_0000002")
    assert kept and (save / "latest_checkpointed_iteration.txt").read_text().strip() == "2"

    failed = torchrun(2, common, tmp_path, preexec=limited(LIMIT))
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0, tail(failed)
    lines = error_lines(output)
    assert len(lines) == 1, f"{lines}\n{tail(failed)}"
    for text in ("checkpoint save failed", "File too large", f"{save / 'iter_0000002'} is intact", "exiting"):
        assert text in lines[0], lines[0]
    assert child_frames(output) == [], tail(failed)
    assert re.search(r"iteration\s+4/\s*6", output), "the failure was at the save after iteration 4"
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt"], \
        "the failed save left something behind"
    assert digest(save / "iter_0000002") == kept
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "2"

    resumed = run_pretrain(common + ["--exit-interval", "4"], nproc=2)
    assert resumed.returncode == 0, megatron_tail(resumed.output)
    assert re.search(r"iteration\s+3/\s*6", resumed.output), megatron_tail(resumed.output)
    assert not re.search(r"iteration\s+1/", resumed.output), "the resumed run started from scratch"
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "4"


def test_retries_train_on_and_the_next_save_succeeds(tmp_path):
    """Async saves fail under the limit; the test lifts it after the first reported failure."""
    save = tmp_path / "ckpt"
    args = TINY_QWEN3 + FORMAT + ["--save", str(save), "--save-interval", "4", "--train-iters", "40",
                                  "--async-save", "--save-failure-retries", "100"]
    rendezvous = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.Popen([sys.executable, SCRIPT, *args], cwd=tmp_path, env=base_env(TORCH_COMPILE_DISABLE="1", **rendezvous),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=limited(LIMIT),
                            start_new_session=True)
    lines, lifted_at = [], None
    end_all = lambda: os.killpg(proc.pid, signal.SIGKILL)  # noqa: E731  (the run and its checkpoint worker)
    timer = threading.Timer(300, end_all)  # a hung run fails the test instead of hanging it
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if lifted_at is None and "warning: checkpoint save failed" in line:
                for pid in [proc.pid] + descendants(proc.pid):
                    hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]
                    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))
                lifted_at = len(lines)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            end_all()
    output = "".join(lines)
    assert proc.returncode == 0, output[-4000:]
    assert lifted_at is not None, "no save failed under the limit"
    warnings = [line for line in lines if "warning: checkpoint save failed" in line]
    assert warnings and all("File too large" in w for w in warnings), warnings
    assert error_lines(output) == []
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "40"
    left = sorted(p.name for p in save.iterdir())
    assert not [name for name in left if name.startswith(".")], f"staging left behind: {left}"
    for name in left:
        if name.startswith("iter_"):
            assert (save / name / "metadata.json").is_file(), f"{name} is not a complete checkpoint"
    assert "iter_0000040" in left

