"""Which accelerator this process trains on: ``npu``, ``cuda`` or ``cpu``.

Detection order is NPU, then CUDA, then CPU: a machine with torch_npu and an
Ascend device is an NPU machine even if it also sees a GPU. The environment
variable ``ADAPTOR_BACKEND`` (``npu``, ``cuda`` or ``cpu``) overrides it, for
example to train on CPU on a GPU host.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from adaptor import env as variables

ENV_VAR = "ADAPTOR_BACKEND"
BACKENDS = ("npu", "cuda", "cpu")


class BackendError(RuntimeError):
    """The requested backend is unknown or not usable here."""


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


def _npu_usable() -> bool:
    try:
        torch_npu = importlib.import_module("torch_npu")
    except Exception:
        return False
    npu = getattr(torch, "npu", None) or getattr(torch_npu, "npu", None)
    try:
        return bool(npu is not None and npu.is_available() and npu.device_count() > 0)
    except Exception:
        return False


def _cuda_usable() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


def detect_backend(env: dict | None = None) -> Backend:
    requested = variables.value(ENV_VAR, env).lower()
    if requested:
        if requested not in BACKENDS:
            raise BackendError(
                f"{ENV_VAR}={requested!r} is not a backend; choose one of {', '.join(BACKENDS)}"
            )
        if requested == "npu" and not _npu_usable():
            raise BackendError(f"{ENV_VAR}=npu but torch_npu is not installed or sees no Ascend device")
        if requested == "cuda" and not _cuda_usable():
            raise BackendError(f"{ENV_VAR}=cuda but torch sees no CUDA device")
        return Backend(requested, _DIST[requested], ENV_VAR)
    if _npu_usable():
        return Backend("npu", "hccl", "detected")
    if _cuda_usable():
        return Backend("cuda", "nccl", "detected")
    return Backend("cpu", "gloo", "detected")
