"""Megatron's resume command lines: asynchronous saves by its persistent worker, and its FSDP2 format.

Two save/resume pairs, each a 2-process run of the tiny Qwen3 (fp32, 6 iterations, a checkpoint
every 3) and a second run that ``--load``s its iteration-3 checkpoint and trains on to 6:

* ``torch_dist`` at DP=2 (plain DDP) saved with ``--async-save --use-persistent-ckpt-worker`` and
  no ``--async-strategy``: Megatron's default (nvidia-resiliency-ext's writer) is not installed,
  so the run must say it uses Megatron's own and write through the worker process; the resume
  saves synchronously.
* ``torch_dcp`` with ``--use-torch-fsdp2`` (Megatron's format for FSDP2) saved synchronously; the
  resume saves with ``--async-save --use-persistent-ckpt-worker``.

The resumed losses must equal the first run's to the last printed digit, and its iteration-6
checkpoint (weights, Adam moments and steps, scheduler, RNG states) must equal the first run's
byte for byte: written by the other writer, it also shows that the async and the synchronous
writer store the same thing. The argument checks: tests/unit/test_async_and_dcp_arguments.py.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from helpers.checkpoint_compare import checkpoint_differences, torch_dcp_differences
from helpers.megatron_runs import TINY_QWEN3, run_pretrain, tail

ITERS, INTERVAL = 6, 3
ASYNC = ["--async-save", "--use-persistent-ckpt-worker"]
CASES = {
    # case: (flags of both runs, the first run's extra flags, the resume's extra flags, comparison)
    "torch_dist_dp2_async_first": (["--ckpt-format", "torch_dist"], ASYNC, [], checkpoint_differences),
    "torch_dcp_fsdp2_async_resume": (["--use-torch-fsdp2", "--ckpt-format", "torch_dcp"], [], ASYNC,
                                     torch_dcp_differences),
}
NVRX_MISSING = importlib.util.find_spec("nvidia_resiliency_ext") is None


def train(save: Path, flags, *extra):
    return run_pretrain(TINY_QWEN3 + ["--train-iters", str(ITERS), "--save", str(save), "--save-interval",
                                      str(INTERVAL), *flags, *extra], nproc=2)


def assert_async_by_the_worker(run, saves: int) -> None:
    if NVRX_MISSING:
        assert "async_strategy=mcore (for --async-save" in run.output, tail(run.output)
    assert "Async Caller Started" in run.output, tail(run.output)  # Megatron's persistent worker process
    assert run.output.count("scheduled an async checkpoint save") == saves, tail(run.output)


@pytest.mark.parametrize("case", CASES)
def test_resume_continues_the_curve_bit_exactly(case, tmp_path):
    flags, first_extra, resume_extra, differences = CASES[case]
    first = train(tmp_path / "first", flags, *first_extra)
    assert first.returncode == 0, tail(first.output)
    assert sorted(first.losses) == list(range(1, ITERS + 1)), tail(first.output)
    assert (tmp_path / "first" / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS)
    if first_extra:
        assert_async_by_the_worker(first, saves=2)

    load = tmp_path / "at3"  # the first run's iteration-3 checkpoint, as the latest of a --load directory
    load.mkdir()
    (load / "iter_0000003").symlink_to(tmp_path / "first" / "iter_0000003")
    (load / "latest_checkpointed_iteration.txt").write_text("3")
    resumed = train(tmp_path / "resumed", flags, "--load", str(load), *resume_extra)
    assert resumed.returncode == 0, tail(resumed.output)
    assert "at iteration 3" in resumed.output, tail(resumed.output)
    assert sorted(resumed.losses) == list(range(INTERVAL + 1, ITERS + 1)), tail(resumed.output)
    assert all(resumed.losses[i] == first.losses[i] for i in resumed.losses), (resumed.losses, first.losses)
    if resume_extra:
        assert_async_by_the_worker(resumed, saves=1)

    diffs, count = differences(tmp_path / "first" / "iter_0000006", tmp_path / "resumed" / "iter_0000006")
    assert not diffs and count > 0, diffs
