"""Detection's device-node criterion, on this host's real torch (a CUDA build without a GPU or driver).

The criterion (adaptor/backend.py's docstring): a CUDA build whose runtime counts no device is a CPU machine,
quietly, unless the NVIDIA driver shows GPUs: NVML counts some, or its per-GPU device nodes exist with
``CUDA_VISIBLE_DEVICES`` not hiding every device; a torch_npu counting no device likewise, unless the
Ascend driver's nodes exist. A fake device node cannot be made in ``/dev`` on a shared host, so these
tests point the module's node pattern at a file of their own; everything else, torch's NVML query,
``torch.cuda.is_available()`` and ``torch.cuda.init()``'s real ``RuntimeError``, is this machine's. The fresh-process proofs with broken packages on the path are tests/e2e/test_broken_accelerator.py.
"""
from __future__ import annotations

import glob
import os

import pytest
import torch

from adaptor import backend

cuda_build_without_gpu = pytest.mark.skipif(
    not torch.backends.cuda.is_built() or torch.cuda.is_available() or glob.glob(backend.NVIDIA_DEVICE_NODES),
    reason="needs a CUDA build of torch on a host where CUDA does not start and no NVIDIA device node exists")


@pytest.fixture
def node(tmp_path, monkeypatch):
    (tmp_path / "nvidia0").write_bytes(b"")
    (tmp_path / "nvidiactl").write_bytes(b"")  # the control node alone is no GPU; it does not match
    monkeypatch.setattr(backend, "NVIDIA_DEVICE_NODES", str(tmp_path / "nvidia[0-9]*"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "nvidia0"


@cuda_build_without_gpu
def test_cuda_build_without_gpu_or_driver_is_a_quiet_cpu_run(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert backend.detect_backend({}) == backend.Backend("cpu", "gloo", "detected")


@cuda_build_without_gpu
def test_control_node_alone_is_no_gpu(node):
    node.unlink()
    assert backend.detect_backend({}).name == "cpu"


@cuda_build_without_gpu
def test_gpu_device_node_that_cuda_cannot_start_stops(node):
    with pytest.raises(backend.BackendError) as caught:
        backend.detect_backend({})
    message = str(caught.value)
    assert f"CUDA cannot start although {node} exists: RuntimeError: " in message
    assert "ADAPTOR_BACKEND=cpu" in message and torch.version.cuda in message


@cuda_build_without_gpu
@pytest.mark.parametrize("hidden", ["", "-1", " -1,0"])
def test_cuda_visible_devices_hiding_every_device_is_a_cpu_run(node, monkeypatch, hidden):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
    assert backend.detect_backend({}).name == "cpu"


@cuda_build_without_gpu
def test_cuda_visible_devices_naming_a_device_is_not_hiding(node, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(backend.BackendError, match="CUDA cannot start"):
        backend.detect_backend({})


@cuda_build_without_gpu
def test_cpu_asked_for_looks_at_no_accelerator(node):
    assert backend.detect_backend({"ADAPTOR_BACKEND": "cpu"}) == backend.Backend("cpu", "gloo", "ADAPTOR_BACKEND")


@cuda_build_without_gpu
def test_cuda_asked_for_names_the_reason(node):
    with pytest.raises(backend.BackendError, match=f"CUDA cannot start although {node} exists"):
        backend.detect_backend({"ADAPTOR_BACKEND": "cuda"})


ASCEND_CHILD = r"""
import json, os, sys
from adaptor import backend  # import adaptor detects with the real /dev pattern: no Ascend node here
backend.ASCEND_DEVICE_NODES = sys.argv[1]
facts = {}
for case, visible in (("node", None), ("hidden", "")):
    if visible is not None:
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = visible
    try:
        facts[case] = backend.detect_backend({}).name
    except backend.BackendError as exc:
        facts[case] = "error: " + str(exc)
print("FACTS" + json.dumps(facts))
"""


@pytest.mark.skipif(bool(glob.glob(backend.ASCEND_DEVICE_NODES)), reason="an Ascend host: its own nodes decide")
def test_ascend_device_node_with_torch_npu_counting_none_stops(tmp_path):
    """torch_npu's device_count() answers 0 when aclrtGetDeviceCount fails; /dev/davinci0 says NPUs are there.

    A fresh interpreter with a real package on its path (helpers/broken_accelerators.py); only the node
    pattern points at this test's directory, as /dev cannot hold a fake node on a shared host."""
    from helpers.broken_accelerators import INIT_ERROR, torch_npu_counting_no_device
    from helpers.processes import run_child, tagged_json

    package = torch_npu_counting_no_device(tmp_path / "site")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "davinci0").write_bytes(b"")
    (tmp_path / "dev" / "davinci_manager").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k not in ("ADAPTOR_BACKEND", "ASCEND_RT_VISIBLE_DEVICES")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(package), env.get("PYTHONPATH")])), ADAPTOR_QUIET="1")
    out = run_child(ASCEND_CHILD, str(tmp_path / "dev" / "davinci[0-9]*"), env=env, timeout=120, warm=False)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = tagged_json(out.stdout)
    assert facts["node"].startswith("error: torch_npu imported from ")
    assert f"sees no Ascend device although {tmp_path / 'dev' / 'davinci0'} exists: RuntimeError: {INIT_ERROR}" \
        in facts["node"]
    assert "set_env.sh" in facts["node"] and "ADAPTOR_BACKEND=cpu" in facts["node"]
    assert not facts["hidden"].startswith("error"), facts["hidden"]
