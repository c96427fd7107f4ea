"""A bad command line ends with ONE ``megatron-adaptor: error:`` line: launching such runs and checking that.

Shared by the bad-input tests of pretrain_gpt.py, pretrain_mm.py, checkpoints and FSDP2 configurations.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.megatron_runs import Run, launch
from helpers.warm_launcher import torchrun_root_cause
from helpers.processes import free_port, without_launcher

SCRIPT = str(ROOT / "pretrain_gpt.py")
PREFIX = "megatron-adaptor: error:"
TIMEOUT = 180


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    return str(Path(next(iter(spec.submodule_search_locations))).resolve())


MEGATRON_DIR = _package_dir("megatron")
TORCH_DISTRIBUTED_DIR = str(Path(_package_dir("torch")) / "distributed")

# A traceback frame, with or without the "[rankN]:" prefix torch adds to a
# worker's uncaught-exception output once its process group exists.
_FRAME = re.compile(r'^(?:\[rank\d+\]:)?\s*File "([^"]+)", line \d+', re.MULTILINE)


def child_frames(output: str) -> list[str]:
    """Traceback frames that come from the training process, not the launcher.

    When a worker fails, torchrun itself raises ChildFailedError and prints a
    "Traceback" whose frames all lie in torch/distributed (plus bin/torchrun
    or <frozen runpy>), so searching the output for the word "Traceback" cannot
    tell a launcher report from a crash. Neither can the "[rank0]:" prefix:
    torch adds it only after init_process_group, and argument errors happen
    before that, so a regression there would print an unprefixed traceback.
    What every traceback of the training process does have is a frame in
    pretrain_gpt.py (its entry point) and, for a failure inside Megatron, frames
    under site-packages/megatron; torchrun's report has neither. So: any frame
    in this repository or in megatron is a child traceback, whichever process
    printed it and whatever prefix it carries.
    """
    frames = []
    for path in _FRAME.findall(output):
        resolved = str(Path(path).resolve()) if not path.startswith("<") else path
        # A virtualenv may live inside the repository (.ci/run makes .venv there):
        # installed packages are not our code, megatron excepted.
        ours = resolved.startswith(str(ROOT)) and "site-packages" not in Path(resolved).parts
        if ours or resolved.startswith(MEGATRON_DIR):
            frames.append(path)
    return frames


def launcher_only_frames(output: str) -> bool:
    """Every frame printed lies in torchrun's own code (the ChildFailedError report)."""
    for path in _FRAME.findall(output):
        if path.startswith("<frozen "):
            continue
        resolved = str(Path(path).resolve())
        if not (resolved.startswith(TORCH_DISTRIBUTED_DIR) or Path(path).name == "torchrun"):
            return False
    return True


def base_env(**extra) -> dict:
    env = without_launcher(dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ADAPTOR_BACKEND="cpu"))
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """subprocess.run with a timeout that also ends torchrun's workers.

    On timeout subprocess.run kills only its direct child; torchrun's workers
    would live on as orphans. The command gets its own session, and the whole
    process group is killed instead.
    """
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"no exit within {TIMEOUT} s: {' '.join(cmd)}\n{os.linesep.join((out + err).splitlines()[-60:])}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_torchrun(nproc: int, args: list[str], cwd: Path, warm: bool = True, **env) -> Run:
    """``torchrun --nproc_per_node nproc pretrain_gpt.py args`` in ``cwd`` (warm unless ``warm=False``)."""
    return launch(SCRIPT, args, nproc, env, TIMEOUT, cwd=cwd, warm=warm)


def run_python(args: list[str], cwd: Path, script: str = SCRIPT, warm: bool = True, **env) -> Run:
    """One process of ``script`` (pretrain_gpt.py), with the variables torchrun --nproc_per_node 1 would set."""
    rendezvous = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return launch(script, args, 1, {**rendezvous, **env}, TIMEOUT, launcher="python", cwd=cwd, warm=warm)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(PREFIX)]


def assert_one_line_error(proc, must_name: list[str], torchrun: bool) -> str:
    output = proc.stdout + proc.stderr
    where = f"\n--- output tail ---\n{os.linesep.join(output.splitlines()[-60:])}"
    assert proc.returncode != 0, where
    lines = error_lines(output)
    assert len(lines) == 1, f"expected one {PREFIX!r} line, got {lines}{where}"
    for text in must_name:
        assert text in lines[0], f"{text!r} not named in: {lines[0]}"
    assert child_frames(output) == [], f"traceback from the training process: {child_frames(output)}{where}"
    if torchrun:
        assert launcher_only_frames(output), where
        # The worker left through adaptor.errors.fail (SystemExit(2)), not an
        # uncaught exception (1); and rank 0, the one that prints, was the
        # first to exit rather than being SIGTERMed by the launcher before it could.
        first = getattr(proc, "first_failure", None) if getattr(proc, "warm", False) else torchrun_root_cause(output)
        assert first == (0, 2), where
    else:
        assert "Traceback" not in output, where
        assert proc.returncode == 2, where
    return lines[0]


def assert_nothing_written(scratch: Path) -> None:
    leftovers = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*"))
    assert leftovers == [], f"the failed run wrote {leftovers}"
