"""``--ckpt-format torch`` checkpoints are unpickled with weights_only=True and an allow-list (safe_torch_load).

A checkpoint whose pickle would run code (``__reduce__`` returning ``os.system`` or ``exec``) given
to ``pretrain_gpt.py --load``: the code does not run (its marker file never appears), the run exits
non-zero with one ``megatron-adaptor: error:`` line naming the file and the refused global and no
traceback, and the checkpoint is left byte for byte as it was; so too with
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, which would otherwise switch torch back to plain pickle. The
checkpoint Megatron itself saved resumes under the same settings, and ``--ckpt-allow-unsafe-pickle``
warns when the run starts.
"""
from __future__ import annotations

import builtins
import hashlib
import os
import shutil

import pytest
import torch

from adaptor.safe_load import torch_load
from helpers.megatron_runs import TINY_QWEN3, run_pretrain, tail
from helpers.one_line_errors import assert_one_line_error, error_lines, run_python
from helpers.prefetch import prefetched

RANK_FILE = "iter_0000001/mp_rank_00/model_optim_rng.pt"


class _RunsShell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _RunsPython:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",)


PAYLOADS = {"os.system": (_RunsShell, "posix.system"), "exec": (_RunsPython, "exec")}


@prefetched
def torch_checkpoint(tmp_path_factory):
    """One iteration of the tiny Qwen3, saved by Megatron with --ckpt-format torch."""
    save = tmp_path_factory.mktemp("torch_ckpt") / "ckpt"
    run = run_pretrain(TINY_QWEN3 + ["--train-iters", "1", "--save", str(save), "--save-interval", "1",
                                     "--ckpt-format", "torch"])
    assert run.returncode == 0, tail(run.output)
    return save


def digests(directory):
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def resume_flags(load):
    return TINY_QWEN3 + ["--train-iters", "2", "--load", str(load), "--ckpt-format", "torch",
                         "--override-opt_param-scheduler"]


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_checkpoint_that_would_run_code_is_refused_in_one_line(torch_checkpoint, tmp_path, payload):
    make, refused = PAYLOADS[payload]
    ckpt = shutil.copytree(torch_checkpoint, tmp_path / "ckpt")
    marker = tmp_path / "code_ran"
    state = torch_load(ckpt / RANK_FILE, map_location="cpu")
    state["rng_state"] = [make(marker)]  # what Megatron unpickles on every rank while loading
    torch.save(state, ckpt / RANK_FILE)
    before = digests(ckpt)
    proc = run_python(resume_flags(ckpt), cwd=tmp_path, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    assert_one_line_error(proc, [str(ckpt / RANK_FILE), f"refused to unpickle {refused}",
                                        "--ckpt-allow-unsafe-pickle"], torchrun=False)
    assert not marker.exists(), "the checkpoint's code ran"
    assert digests(ckpt) == before


def test_megatrons_own_torch_checkpoint_resumes(torch_checkpoint, tmp_path):
    """The allow-list holds what Megatron saves (arguments, RNG states, rerun state), even where
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 would have turned weights_only off."""
    ckpt = shutil.copytree(torch_checkpoint, tmp_path / "ckpt")
    run = run_pretrain(resume_flags(ckpt), env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert run.returncode == 0, tail(run.output)
    assert "successfully loaded checkpoint" in run.output and sorted(run.losses) == [2], tail(run.output)
    assert "--ckpt-allow-unsafe-pickle" not in run.output


def test_unsafe_pickle_opt_out_warns(torch_checkpoint, tmp_path):
    ckpt = shutil.copytree(torch_checkpoint, tmp_path / "ckpt")
    run = run_pretrain(resume_flags(ckpt) + ["--ckpt-allow-unsafe-pickle"])
    assert run.returncode == 0, tail(run.output)
    warnings = [line for line in run.output.splitlines() if "--ckpt-allow-unsafe-pickle" in line]
    assert len(warnings) == 1 and "arbitrary code" in warnings[0], warnings
    assert "successfully loaded checkpoint" in run.output


def test_unreadable_torch_checkpoint_is_one_line_and_a_failure(torch_checkpoint, tmp_path):
    """Megatron prints torch.load's exception and calls sys.exit() (status 0); now one line, status 2."""
    ckpt = shutil.copytree(torch_checkpoint, tmp_path / "ckpt")
    state = torch_load(ckpt / RANK_FILE, map_location="cpu")
    torch.save(state, ckpt / RANK_FILE, _use_new_zipfile_serialization=False)  # legacy format: no zip check
    raw = (ckpt / RANK_FILE).read_bytes()
    (ckpt / RANK_FILE).write_bytes(raw[: len(raw) // 2])
    proc = run_python(resume_flags(ckpt), cwd=tmp_path)
    assert proc.returncode != 0
    lines = error_lines(proc.stdout + proc.stderr)
    assert len(lines) == 1 and str(ckpt / RANK_FILE) in lines[0], tail(proc.stdout + proc.stderr)
