"""Seeing a run: TensorBoard scalars (memory and MFU included), wandb offline, MFU in the log, profiler traces.

Two short runs side by side: one on the CPU backend with every visibility flag at once, one on
the NPU backend (torch_npu STAND-IN) through torch_npu's profiler API. What they write is read
back: TensorBoard event files through tensorboard's own EventAccumulator, traces as JSON.
"""
from __future__ import annotations

import glob
import json
import re

import pytest

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, side_by_side, tail
from helpers.npu_contract import standin_env

# A test dependency (setup.py's "test" extra), imported, not skipped without: the NPU run here proves a
# backend contract, and a missing tensorboard must not make that proof vanish.
import tensorboard  # noqa: E402,F401

ITERS = 4
COMMON = TINY_QWEN3 + ["--train-iters", str(ITERS), "--log-throughput", "--log-timers-to-tensorboard",
                       "--log-memory-to-tensorboard", "--profile", "--profile-step-start", "1",
                       "--profile-step-end", "3"]
MFU = re.compile(r"throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \| MFU: ([0-9.]+) % \|")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("visibility")
    cpu_args = COMMON + ["--tensorboard-dir", str(root / "cpu" / "tb"), "--wandb-project", "visibility",
                         "--wandb-save-dir", str(root / "cpu" / "wandb")]
    npu_args = COMMON + ["--tensorboard-dir", str(root / "npu" / "tb"), "--profile-level", "level1",
                         "--profile-with-cpu", "--profile-save-path", str(root / "npu" / "profile")]
    npu_env = standin_env(ADAPTOR_BACKEND="npu", WANDB_MODE="offline")
    cpu, npu = side_by_side(lambda: run_pretrain(cpu_args, env={"WANDB_MODE": "offline"}),
                            lambda: run_pretrain(npu_args, env=npu_env))
    return root, cpu, npu


def _scalars(directory) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _trace(path) -> dict:
    with open(path) as f:
        return json.load(f)


def test_cpu_run_writes_scalars_mfu_wandb_and_a_chrome_trace(runs):
    root, cpu, _ = runs
    assert cpu.returncode == 0 and len(cpu.losses) == ITERS, tail(cpu.output)
    assert "MFU peak: measured on this CPU: fp32 matmul 128x64x192" in cpu.output, tail(cpu.output)
    mfus = [float(v) for v in MFU.findall(cpu.output)]
    assert len(mfus) == ITERS and all(v > 0 for v in mfus), tail(cpu.output)

    scalars = _scalars(root / "cpu" / "tb")
    for tag in ("lm loss", "learning-rate", "grad-norm", "throughput", "mfu", "mem-rss-bytes", "mem-max-rss-bytes"):
        assert tag in scalars, f"{tag} not in {sorted(scalars)}"
    # the event file holds the losses the log printed
    assert scalars["lm loss"] == pytest.approx(cpu.curve()[-len(scalars["lm loss"]):], rel=1e-5)
    assert all(v > 2**20 for v in scalars["mem-rss-bytes"])
    assert all(0 < v < 10 for v in scalars["mfu"])

    traces = glob.glob(str(root / "cpu" / "torch_profile" / "rank0.*.pt.trace.json"))
    assert len(traces) == 1, sorted(glob.glob(str(root / "cpu" / "**"), recursive=True))
    events = _trace(traces[0])["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 2, steps  # iterations 1 and 2
    assert any(e.get("name") == "aten::mm" or e.get("name") == "aten::addmm" for e in events)

    assert glob.glob(str(root / "cpu" / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb")), tail(cpu.output)
    assert "--profile: torch.profiler (cpu) on every rank, iterations 1..2" in cpu.output


def test_npu_run_profiles_through_torch_npu_and_writes_memory(runs):
    root, _, npu = runs
    assert npu.returncode == 0 and len(npu.losses) == ITERS, tail(npu.output)
    assert "--profile: torch_npu.profiler level1 (cpu)" in npu.output, tail(npu.output)
    assert "MFU is not printed: no fp32 peak is known" in npu.output, tail(npu.output)
    assert not MFU.search(npu.output)

    scalars = _scalars(root / "npu" / "tb")
    for tag in ("lm loss", "mem-rss-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes"):
        assert tag in scalars, f"{tag} not in {sorted(scalars)}"
    # the stand-in's handler names files as torch_npu's does (host_pid), not rank<R> as the CPU path
    traces = glob.glob(str(root / "npu" / "profile" / "*.pt.trace.json"))
    assert len(traces) == 1 and "rank0" not in traces[0], traces
    assert "traceEvents" in _trace(traces[0])
