"""Shared machinery of the CPU and NPU device redirects.

Megatron names its accelerator "cuda" in device arguments: ``device='cuda'``,
``device=torch.cuda.current_device()`` (an int), ``torch.device('cuda', i)``,
``tensor.to('cuda')``. A redirect rewrites those arguments to the backend's
device type before the call reaches torch, for the tensor factories and for
``Tensor.to``/``Module.to``, and drops ``pin_memory=True`` where no accelerator exists. ``cpu_device`` and ``npu_device`` register it with
their own mapping; nothing here patches anything by itself.
"""
from __future__ import annotations

from typing import Callable

import torch

#: torch.cuda names Megatron calls, each taken from the backend's module (torch.npu) when it has it.
CUDA_NAMES = (
    "is_available", "current_device", "device_count", "set_device", "synchronize", "empty_cache",
    "ipc_collect", "get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all",
    "Stream", "Event", "current_stream", "default_stream", "stream",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "memory_stats", "mem_get_info",
    "get_device_name", "get_device_properties", "get_device_capability",
)

FACTORIES = (
    "tensor", "as_tensor", "empty", "empty_like", "empty_strided", "zeros", "zeros_like",
    "ones", "ones_like", "full", "full_like", "arange", "linspace", "logspace", "eye",
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
)


def cuda_index(device) -> tuple[bool, int | None]:
    """(is this a CUDA device spec?, its index or None)."""
    if isinstance(device, bool):
        return False, None
    if isinstance(device, int):
        return True, device
    if isinstance(device, str):
        if device == "cuda":
            return True, None
        if device.startswith("cuda:"):
            return True, int(device[5:])
        return False, None
    if isinstance(device, torch.device) and device.type == "cuda":
        return True, device.index
    return False, None


def make_mapper(target: str) -> Callable:
    """A function mapping CUDA device specs to ``target`` (``cpu`` or ``npu``)."""

    def to_target(device):
        is_cuda, index = cuda_index(device)
        if not is_cuda:
            return device
        if target == "cpu":
            return torch.device("cpu")
        return torch.device(target, index) if index is not None else torch.device(target)

    to_target.__name__ = f"to_{target}_device"
    return to_target


def register_device_arguments(pm, owner: str, mapper: Callable) -> None:
    """Rewrite device arguments of torch's factories and of ``.to()`` with ``mapper``."""

    def device_kwarg(wrapped, instance, call_args, kwargs):
        if "device" in kwargs:
            kwargs["device"] = mapper(kwargs["device"])
        if kwargs.get("pin_memory") and not torch.accelerator.is_available():
            # Pinned host memory only speeds copies to an accelerator; without one torch refuses it
            # (RoPE's get_pos_emb_on_this_cp_rank asks for it under context parallelism).
            kwargs["pin_memory"] = False
        return wrapped(*call_args, **kwargs)

    def to(wrapped, instance, call_args, kwargs):
        # Tensor.to / Module.to: the device may also be the first positional argument.
        if call_args and isinstance(call_args[0], (str, int, torch.device)):
            call_args = (mapper(call_args[0]),) + tuple(call_args[1:])
        if "device" in kwargs:
            kwargs["device"] = mapper(kwargs["device"])
        return wrapped(*call_args, **kwargs)

    for name in FACTORIES:
        pm.register_wrapper(f"torch.{name}", device_kwarg, owner)
    pm.register_wrapper("torch.Tensor.to", to, owner)
    pm.register_wrapper("torch.nn.Module.to", to, owner)


def register_collective_backend(pm, owner: str, dist_backend: str) -> None:
    """Map an explicit ``backend='nccl'`` in process-group creation to ``dist_backend``.

    Megatron passes ``--distributed-backend`` to ``init_process_group``, but a
    few upstream helpers create groups with a literal ``backend='nccl'``.
    """

    def backend_kwarg(wrapped, instance, call_args, kwargs):
        if kwargs.get("backend") in ("nccl", "cuda:nccl"):
            kwargs["backend"] = dist_backend
        return wrapped(*call_args, **kwargs)

    for name in ("init_process_group", "new_group", "new_subgroups_by_enumeration"):
        pm.register_wrapper(f"torch.distributed.{name}", backend_kwarg, owner)
