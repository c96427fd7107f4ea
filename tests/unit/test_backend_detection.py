"""CUDA detection's criterion, in process, on this host's real torch (a CUDA build without a GPU or driver).

The criterion (adaptor/backend.py's docstring): a CUDA build whose runtime counts no device is a CPU machine,
quietly, unless the NVIDIA driver shows GPUs: NVML counts some, or its per-GPU device nodes exist with
``CUDA_VISIBLE_DEVICES`` not hiding every device. A fake device node cannot be made in ``/dev`` on a shared
host, so these tests point the module's node pattern at a file of their own; everything else, torch's
NVML query, ``torch.cuda.is_available()`` and ``torch.cuda.init()``'s real ``RuntimeError``, is this
machine's. The fresh-process proofs with broken packages on the path are tests/e2e/test_broken_accelerator.py.
"""
from __future__ import annotations

import glob

import pytest
import torch

from adaptor import backend

pytestmark = pytest.mark.skipif(
    not torch.backends.cuda.is_built() or torch.cuda.is_available() or glob.glob(backend.NVIDIA_DEVICE_NODES),
    reason="needs a CUDA build of torch on a host where CUDA does not start and no NVIDIA device node exists")


@pytest.fixture
def node(tmp_path, monkeypatch):
    (tmp_path / "nvidia0").write_bytes(b"")
    (tmp_path / "nvidiactl").write_bytes(b"")  # the control node alone is no GPU; it does not match
    monkeypatch.setattr(backend, "NVIDIA_DEVICE_NODES", str(tmp_path / "nvidia[0-9]*"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "nvidia0"


def test_cuda_build_without_gpu_or_driver_is_a_quiet_cpu_run(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert backend.detect_backend({}) == backend.Backend("cpu", "gloo", "detected")


def test_control_node_alone_is_no_gpu(node):
    node.unlink()
    assert backend.detect_backend({}).name == "cpu"


def test_gpu_device_node_that_cuda_cannot_start_stops(node):
    with pytest.raises(backend.BackendError) as caught:
        backend.detect_backend({})
    message = str(caught.value)
    assert f"CUDA cannot start although {node} exists: RuntimeError: " in message
    assert "ADAPTOR_BACKEND=cpu" in message and torch.version.cuda in message


@pytest.mark.parametrize("hidden", ["", "-1", " -1,0"])
def test_cuda_visible_devices_hiding_every_device_is_a_cpu_run(node, monkeypatch, hidden):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
    assert backend.detect_backend({}).name == "cpu"


def test_cuda_visible_devices_naming_a_device_is_not_hiding(node, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(backend.BackendError, match="CUDA cannot start"):
        backend.detect_backend({})


def test_cpu_asked_for_looks_at_no_accelerator(node):
    assert backend.detect_backend({"ADAPTOR_BACKEND": "cpu"}) == backend.Backend("cpu", "gloo", "ADAPTOR_BACKEND")


def test_cuda_asked_for_names_the_reason(node):
    with pytest.raises(backend.BackendError, match=f"CUDA cannot start although {node} exists"):
        backend.detect_backend({"ADAPTOR_BACKEND": "cuda"})
