"""Which accelerator this process trains on: ``npu``, ``cuda`` or ``cpu``.

Detection order is NPU, then CUDA, then CPU: a machine with torch_npu and an
Ascend device is an NPU machine even if it also sees a GPU. The environment
variable ``ADAPTOR_BACKEND`` (``npu``, ``cuda`` or ``cpu``) overrides it, for
example to train on CPU on a GPU host; then only the backend asked for is
looked at (``ADAPTOR_BACKEND=cpu`` never imports torch_npu nor starts CUDA).

The backend is what the machine has, or the run stops. An accelerator that is
there but does not start is a broken environment, not a CPU machine: an 8-rank
job that fell back to CPU over gloo would train for hours at a fraction of the
speed, with one word in the banner to say so. So :class:`BackendError` (one
line, status 2 through :func:`adaptor.errors.fail`) ends the run when

- torch_npu is installed (``importlib.util.find_spec`` finds it) but importing
  it raises (CANN's ``set_env.sh`` not sourced: ``libhccl.so``/``libascendcl.so``
  cannot be opened; torch and torch_npu versions apart), or its device query
  (``torch.npu.is_available()``/``device_count()``) raises;
- torch_npu imports and counts no device while the Ascend driver's per-NPU
  device nodes ``/dev/davinci0``, ... exist (``ASCEND_RT_VISIBLE_DEVICES`` not
  hiding every device). torch_npu's ``device_count()`` does not raise when
  ``aclrtGetDeviceCount`` fails (driver and CANN versions apart): it logs and
  answers 0, so the count alone cannot tell a broken host from a machine
  without NPUs, and the nodes, which only the kernel driver creates, can;
- torch is a CUDA build, the CUDA runtime counts no device, and yet the NVIDIA
  driver shows that GPUs are there (below).

When is a CUDA build without a usable device "no GPU" and when "a GPU CUDA
cannot start"? ``torch.cuda.is_available()`` cannot tell: it asks the CUDA
runtime (``cudaGetDeviceCount``), which answers 0 both when there is no driver
and when the driver is there but fails, and it never raises (a failure is only
a "CUDA initialization" warning). The criterion here asks the kernel driver
instead, which exists only where NVIDIA hardware does:

- NVML, the driver's own library, counts visible GPUs: ``torch.cuda.device_count()``
  before CUDA is initialised is NVML's count (honouring ``CUDA_VISIBLE_DEVICES``)
  whenever NVML loads and initialises, and the runtime's count otherwise; or
- the kernel module's device nodes ``/dev/nvidia0``, ``/dev/nvidia1``, ... exist
  and ``CUDA_VISIBLE_DEVICES`` does not hide every device (``""`` or ``-1``).

Either, with the runtime counting none, is a GPU that CUDA cannot start; the
line gives ``torch.cuda.init()``'s reason (the driver too old for this CUDA
build, ``CUDA_VISIBLE_DEVICES`` naming no device, the library missing). Where
neither holds (a CUDA wheel on a CPU machine or in a CPU container, even one
that ships NVIDIA's user-space libraries, which cannot initialise without the
kernel module), the run is a CPU run, quietly. ``CUDA_VISIBLE_DEVICES``
naming devices is not evidence on its own: scripts and schedulers set it
whether or not a GPU exists.
"""
from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import warnings
from dataclasses import dataclass

import torch

from adaptor import env as variables

ENV_VAR = "ADAPTOR_BACKEND"
BACKENDS = ("npu", "cuda", "cpu")
#: The NVIDIA kernel module's per-GPU device nodes (``/dev/nvidiactl`` and friends do not match).
NVIDIA_DEVICE_NODES = "/dev/nvidia[0-9]*"
#: The Ascend driver's per-NPU device nodes (``/dev/davinci_manager`` does not match).
ASCEND_DEVICE_NODES = "/dev/davinci[0-9]*"
NPU_ADVICE = ("source CANN's set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh) and check that the "
              f"Ascend driver, CANN, torch and torch_npu versions match, or set {ENV_VAR}=cpu to train on CPU")
CUDA_ADVICE = ("check the NVIDIA driver against this torch's CUDA {cuda} (nvidia-smi) and CUDA_VISIBLE_DEVICES, "
               f"or set {ENV_VAR}=cpu to train on CPU")


class BackendError(RuntimeError):
    """The requested backend is unknown or not usable here, or an accelerator is present but broken."""


@dataclass(frozen=True)
class Backend:
    name: str  # npu | cuda | cpu
    dist_backend: str  # hccl | nccl | gloo
    source: str  # "detected" or "ADAPTOR_BACKEND"

    @property
    def device_type(self) -> str:
        return self.name

    def device(self, index: int | None = None) -> torch.device:
        if self.name == "cpu":
            return torch.device("cpu")
        return torch.device(self.name, index) if index is not None else torch.device(self.name)


_DIST = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _npu_devices() -> tuple[int, str]:
    """``(count, why none)``: Ascend devices torch_npu sees; raises :class:`BackendError` when it is broken."""
    spec = importlib.util.find_spec("torch_npu")
    if spec is None:
        return 0, "torch_npu is not installed (install CANN and the torch_npu matching this torch on an Ascend host)"
    where = os.path.dirname(spec.origin) if spec.origin else "torch_npu"
    try:
        torch_npu = importlib.import_module("torch_npu")
    except Exception as exc:
        raise BackendError(f"torch_npu is installed ({where}) but failed to import: {_reason(exc)}; "
                           f"{NPU_ADVICE}") from exc
    npu = getattr(torch, "npu", None) or getattr(torch_npu, "npu", None)
    if npu is None:
        raise BackendError(f"torch_npu imported from {where} but registered no torch.npu; {NPU_ADVICE}")
    try:
        count = int(npu.device_count()) if npu.is_available() else 0
    except Exception as exc:
        raise BackendError(f"torch_npu imported from {where} but its device query failed: {_reason(exc)}; "
                           f"{NPU_ADVICE}") from exc
    nodes = sorted(glob.glob(ASCEND_DEVICE_NODES))
    if count <= 0 and nodes and not _hides_every_device("ASCEND_RT_VISIBLE_DEVICES"):
        reason = ""
        try:
            getattr(npu, "init", lambda: None)()  # torch_npu's lazy init raises with the runtime's reason
        except Exception as exc:
            reason = f": {_reason(exc)}"
        raise BackendError(f"torch_npu imported from {where} sees no Ascend device although {nodes[0]} "
                           f"exists{reason}; {NPU_ADVICE}")
    return count, ("torch_npu sees no Ascend device (`npu-smi info` lists the driver's; "
                   "ASCEND_RT_VISIBLE_DEVICES chooses among them)")


def _hides_every_device(variable: str) -> bool:
    """``CUDA_VISIBLE_DEVICES`` (or Ascend's variable) hides every device (``""``, ``-1``): a deliberate CPU run."""
    visible = os.environ.get(variable)
    if visible is None:
        return False
    first = visible.split(",")[0].strip()
    return first == "" or first.startswith("-")


def _visible_gpu_count() -> int:
    """What ``torch.cuda.device_count()`` answers before CUDA starts (NVML's count where NVML loads, the
    runtime's otherwise), read below that function: in a process already set up for the cpu or npu
    backend, the device patches answer it for the backend's own device."""
    nvml = getattr(torch.cuda, "_device_count_nvml", None)
    count = nvml() if nvml is not None else -1  # -1: NVML cannot be loaded or initialised
    return count if count >= 0 else torch._C._cuda_getDeviceCount()


def _nvidia_gpus_present() -> str:
    """What shows that NVIDIA GPUs are here without the CUDA runtime, or ``""`` (see the module docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NVML missing or failing is the CPU machine's normal case
        try:
            count = _visible_gpu_count()
        except Exception:
            count = 0
    if count > 0:
        return f"the NVIDIA driver (NVML) reports {count} visible GPU{'s' if count > 1 else ''}"
    nodes = sorted(glob.glob(NVIDIA_DEVICE_NODES))
    if nodes and not _hides_every_device("CUDA_VISIBLE_DEVICES"):
        return f"{nodes[0]} exists"
    return ""


def _cuda_devices() -> tuple[int, str]:
    """``(count, why none)``: CUDA devices this torch can use; raises :class:`BackendError` when GPUs are
    present but CUDA cannot start (the criterion of the module docstring)."""
    if not torch.backends.cuda.is_built():
        return 0, "this torch is not built with CUDA"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            available = torch.cuda.is_available()
            failure = None
        except Exception as exc:  # documented never to raise; a broken build might
            available, failure = False, exc
    if available:
        return torch.cuda.device_count(), ""
    evidence = _nvidia_gpus_present()
    if failure is None and not evidence:
        for caught_warning in caught:  # torch's own warnings still reach the user
            warnings.warn_explicit(caught_warning.message, caught_warning.category, caught_warning.filename,
                                   caught_warning.lineno)
        return 0, "torch sees no CUDA device (no NVIDIA GPU or driver here)"
    if failure is None:
        try:
            torch.cuda.init()  # raises with the runtime's reason; only reached where GPUs are present
        except Exception as exc:
            failure = exc
    reason = _reason(failure) if failure is not None else next(
        (str(w.message) for w in caught if "CUDA initialization" in str(w.message)), "torch.cuda.is_available() is False")
    found = f" although {evidence}" if evidence else ""
    raise BackendError(f"CUDA cannot start{found}: {reason}; "
                       + CUDA_ADVICE.format(cuda=torch.version.cuda or "build"))


def detect_backend(env: dict | None = None) -> Backend:
    requested = variables.value(ENV_VAR, env).lower()
    if requested:
        if requested not in BACKENDS:
            raise BackendError(
                f"{ENV_VAR}={requested!r} is not a backend; choose one of {', '.join(BACKENDS)}"
            )
        if requested == "npu":
            count, why = _npu_devices()
            if count <= 0:
                raise BackendError(f"{ENV_VAR}=npu but {why}; unset {ENV_VAR} to use the backend this machine has")
        if requested == "cuda":
            count, why = _cuda_devices()
            if count <= 0:
                raise BackendError(f"{ENV_VAR}=cuda but {why}; "
                                   f"unset {ENV_VAR} to use the backend this machine has")
        return Backend(requested, _DIST[requested], ENV_VAR)
    if _npu_devices()[0] > 0:
        return Backend("npu", "hccl", "detected")
    if _cuda_devices()[0] > 0:
        return Backend("cuda", "nccl", "detected")
    return Backend("cpu", "gloo", "detected")
