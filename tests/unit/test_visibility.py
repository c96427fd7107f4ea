"""Visibility decisions without a run: the slow-precision line, the peak table, the profiler plan and its checks."""
from __future__ import annotations

import argparse

import pytest

from adaptor.backend import Backend
from adaptor.features import ArgumentError, FeatureContext
from adaptor.throughput import Peak, find_peak, mfu, table_peak
from patches.diagnostics.cpu_precision import slow_precision_warning
from patches.diagnostics.profiling import Profiling
from patches.diagnostics.throughput import Throughput


@pytest.mark.parametrize("dtype, flags, warns", [
    ("bf16", {"avx2", "avx512f"}, True),
    ("bf16", {"avx512f", "avx512_bf16"}, False),
    ("bf16", {"amx_bf16", "amx_tile"}, False),
    ("fp16", {"avx512_bf16"}, True),
    ("fp16", {"avx512_fp16"}, False),
    (None, {"avx2"}, False),
    ("bf16", set(), False),  # flags unreadable: nothing is claimed
])
def test_slow_precision_warning(dtype, flags, warns):
    line = slow_precision_warning(dtype, flags)
    assert (line is not None) == warns
    if warns:
        assert f"drop --{dtype}" in line and "15x slower" in line


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H200", "fp32", 66.9),
    ("NVIDIA A100-SXM4-80GB", "fp16", 312.0), ("Ascend910B3", "bf16", 280.0), ("Ascend910_9391", "bf16", 390.6),
    ("Ascend910B3", "fp32", None), ("NVIDIA GeForce RTX 3090", "bf16", None),
])
def test_peak_table(name, dtype, peak):
    assert table_peak(name, dtype) == peak


def _args(**kw):
    base = dict(bf16=True, fp16=False, device_peak_tflops=None, micro_batch_size=1, seq_length=32, hidden_size=32,
                ffn_hidden_size=64, log_throughput=True)
    base.update(kw)
    return argparse.Namespace(**base)


def test_peak_flag_wins_and_cpu_peak_is_measured_once():
    assert find_peak(_args(device_peak_tflops=100.0), "cuda") == Peak(100.0, "--device-peak-tflops 100")
    measured = find_peak(_args(bf16=False), "cpu")
    assert measured.tflops > 0 and "fp32 matmul 32x32x64" in measured.source
    assert find_peak(_args(bf16=False), "cpu") == measured  # cached per process
    assert mfu(50.0, Peak(200.0, "")) == 0.25 and mfu(50.0, Peak(None, "")) is None


def _ctx(backend="cpu"):
    return FeatureContext(Backend(backend, "gloo", "test"), argparse.Namespace())


def _profile_args(**kw):
    base = dict(profile=True, profile_step_start=2, profile_step_end=4, profile_ranks=[], profile_level=None,
                profile_with_cpu=False, profile_with_memory=False, profile_with_stack=False,
                profile_record_shapes=False, profile_save_path=None, tensorboard_dir=None,
                pytorch_profiler_collect_chakra=False, pytorch_profiler_collect_callstack=False,
                pytorch_profiler_collect_shapes=False, rank=1)
    base.update(kw)
    return argparse.Namespace(**base)


def test_profiling_plan_turns_megatrons_own_profile_off():
    from patches.diagnostics import profiling

    args = _profile_args(profile_ranks=[-1], tensorboard_dir="/runs/x/tb")
    Profiling().validate(args, _ctx())
    plan = profiling._state["plan"]
    assert args.profile is False and plan.ranks == () and plan.save_path == "/runs/x/torch_profile"
    assert "iterations 2..3" in plan.describe()


@pytest.mark.parametrize("kw, backend, says", [
    (dict(profile=False, profile_level="level1"), "cpu", "--profile-level set up the profiler"),
    (dict(profile_step_end=2), "cpu", "--profile-step-end 2 must be after"),
    (dict(profile_with_memory=True), "npu", "--profile-with-memory needs --profile-with-cpu"),
    (dict(pytorch_profiler_collect_chakra=True), "cpu", "--pytorch-profiler-collect-chakra"),
])
def test_profiling_refuses_in_one_line(kw, backend, says):
    with pytest.raises(ArgumentError, match=says):
        Profiling().validate(_profile_args(**kw), _ctx(backend))


def test_device_peak_needs_log_throughput_and_a_positive_number():
    with pytest.raises(ArgumentError, match="add --log-throughput"):
        Throughput().validate(_args(log_throughput=False, device_peak_tflops=10.0), _ctx())
    with pytest.raises(ArgumentError, match="a positive number"):
        Throughput().validate(_args(device_peak_tflops=-1.0), _ctx())
