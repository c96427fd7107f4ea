"""An accelerator that is installed but broken stops the run in one line; it never becomes a CPU run.

Each case is the user's command, ``python pretrain_gpt.py <tiny model> --save DIR``, in a fresh process
(``import adaptor`` first) with a broken package of ``helpers/broken_accelerators.py`` on its path: a
torch_npu whose extension cannot find CANN's ``libhccl.so``, a torch_npu whose device query raises, and
(on this CUDA build of torch, on a host without the CUDA driver) an NVIDIA driver library that reports a
GPU. The broken ones end at ``import adaptor``, before Megatron is imported, in about as long as
importing torch takes. ``ADAPTOR_BACKEND=cpu`` on the same host trains, and says it was asked for.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers.broken_accelerators import (
    DEVICE_QUERY_ERROR, MISSING_LIBHCCL, nvml_reporting_one_gpu, torch_npu_failing_device_query,
    torch_npu_missing_libhccl,
)
from helpers.one_line_errors import SCRIPT, assert_nothing_written, assert_one_line_error, base_env, run
from helpers.processes import free_port

TINY = [
    "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--ffn-hidden-size", "64",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "1",
    "--train-iters", "1", "--lr", "1e-3", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--mock-data", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000", "--disable-jit-fuser",
]
NPU_ADVICE = ["set_env.sh", "ADAPTOR_BACKEND=cpu"]


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    root = tmp_path_factory.mktemp("broken_accelerators")
    return {
        "libhccl": torch_npu_missing_libhccl(root / "missing_libhccl"),
        "device_query": torch_npu_failing_device_query(root / "device_query"),
        "nvml": nvml_reporting_one_gpu(root / "nvml"),
    }


@pytest.fixture
def scratch(tmp_path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    return d


def user_run(scratch: Path, backend: str | None = None, pythonpath: Path | None = None,
             libraries: Path | None = None):
    """``python pretrain_gpt.py TINY --save scratch/ckpt`` as typed, with the machine's detection unless told."""
    env = base_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()))
    env.pop("ADAPTOR_BACKEND")
    if backend:
        env["ADAPTOR_BACKEND"] = backend
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    if libraries:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(libraries), *filter(None, [env.get("LD_LIBRARY_PATH")])])
    return run([sys.executable, SCRIPT, *TINY, "--save", str(scratch / "ckpt"), "--save-interval", "1"],
               cwd=scratch, env=env)


def assert_stopped_before_training(proc, scratch: Path, must_name: list[str]) -> str:
    line = assert_one_line_error(proc, must_name, torchrun=False)
    assert "[megatron-adaptor] backend=" not in proc.stdout, "the run was set up on some backend"
    assert_nothing_written(scratch)
    return line


def test_torch_npu_missing_libhccl_stops_the_run(broken, scratch):
    """torch_npu's extension cannot load CANN's libhccl.so (set_env.sh not sourced): the loader's reason."""
    proc = user_run(scratch, pythonpath=broken["libhccl"])
    line = assert_stopped_before_training(proc, scratch, ["torch_npu", "failed to import", MISSING_LIBHCCL,
                                                          *NPU_ADVICE])
    assert str(broken["libhccl"] / "torch_npu") in line, "the line does not say which torch_npu"


def test_torch_npu_failing_device_query_stops_the_run(broken, scratch):
    """torch_npu imports, but torch.npu's device query raises (driver and CANN versions apart)."""
    proc = user_run(scratch, pythonpath=broken["device_query"])
    assert_stopped_before_training(proc, scratch, ["torch_npu", "device query failed",
                                                   f"RuntimeError: {DEVICE_QUERY_ERROR}", *NPU_ADVICE])


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="torch is not a CUDA build: nothing to start")
def test_cuda_build_with_a_gpu_it_cannot_start_stops_the_run(broken, scratch):
    """The NVIDIA driver's NVML reports a GPU and the CUDA runtime cannot start (no libcuda.so.1 here)."""
    assert not torch.cuda.is_available(), "this test needs a host where CUDA does not start"
    proc = user_run(scratch, libraries=broken["nvml"])
    assert_stopped_before_training(proc, scratch, ["CUDA cannot start", "NVIDIA driver (NVML) reports 1 visible GPU",
                                                   "RuntimeError: ", "ADAPTOR_BACKEND=cpu"])


def test_adaptor_backend_cpu_trains_on_the_broken_host(broken, scratch):
    """Asked for CPU, the run never touches the broken torch_npu nor the GPU the driver shows, and trains."""
    proc = user_run(scratch, backend="cpu", pythonpath=broken["libhccl"], libraries=broken["nvml"])
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "[megatron-adaptor] backend=cpu (ADAPTOR_BACKEND), distributed backend=gloo" in proc.stdout
    assert "megatron-adaptor: error:" not in output
    assert (scratch / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


def test_adaptor_backend_npu_without_torch_npu(scratch):
    """ADAPTOR_BACKEND=npu where torch_npu is not installed at all."""
    assert importlib.util.find_spec("torch_npu") is None, "this test needs a host without torch_npu"
    proc = user_run(scratch, backend="npu")
    assert_stopped_before_training(proc, scratch, ["ADAPTOR_BACKEND=npu", "torch_npu is not installed",
                                                   "unset ADAPTOR_BACKEND"])
