"""What one rank holds of the model state, counted from the tensors themselves.

Used by ``ADAPTOR_REPORT_MEMORY=1`` (``patches/diagnostics/memory_report.py``) to compare data-parallel
schemes: with DDP every rank holds all parameters, gradients and optimizer state; with FSDP2
each holds a 1/N shard of each. A DTensor counts with its local shard only. Gradients are
DDP's ``main_grad`` buffers where a parameter has one, else ``.grad``. Optimizer state is every
tensor in the torch optimizers' ``state`` plus main parameters that are copies rather than the
model's own tensors or views of them (the fp32 copies Megatron's Float16 optimizer keeps).
"""
from __future__ import annotations

import resource

import torch

from adaptor.fsdp2.wrapper import local as _local


def _bytes(tensor) -> int:
    if not isinstance(tensor, torch.Tensor):
        return 0
    tensor = _local(tensor)
    return tensor.numel() * tensor.element_size()


def _torch_optimizers(optimizer):
    for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        torch_opt = getattr(inner, "optimizer", None)
        if torch_opt is not None:
            yield torch_opt


def model_state_bytes(model_chunks, optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank holds."""
    params = {id(p): p for chunk in model_chunks for p in chunk.parameters()}
    counts = {"parameters": 0, "gradients": 0, "optimizer": 0}
    for param in params.values():
        counts["parameters"] += _bytes(param)
        grad = getattr(param, "main_grad", None)
        counts["gradients"] += _bytes(grad if grad is not None else param.grad)
    model_storages = {_local(p).untyped_storage().data_ptr() for p in params.values()}
    for torch_opt in _torch_optimizers(optimizer):
        for group in torch_opt.param_groups:
            for main in group["params"]:
                # A main parameter that is a view of the model's own storage (fp32 distributed
                # optimizer) is not a second copy.
                if id(main) not in params and _local(main).untyped_storage().data_ptr() not in model_storages:
                    counts["optimizer"] += _bytes(main)
        for state in torch_opt.state.values():
            counts["optimizer"] += sum(_bytes(value) for value in state.values())
    return counts


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _allocator(device_type: str):
    """``torch.cuda`` / ``torch.npu`` where the backend has a caching allocator to ask, else None."""
    module = getattr(torch, device_type, None) if device_type in ("cuda", "npu") else None
    return module if module is not None and hasattr(module, "max_memory_allocated") else None


def device_peak_mib(device_type: str) -> float | None:
    """The accelerator allocator's peak, or None on CPU."""
    module = _allocator(device_type)
    return None if module is None else module.max_memory_allocated() / 2**20


def memory_scalars(device_type: str) -> dict[str, float]:
    """This process's memory for TensorBoard, by name: the allocator's on NPU/CUDA, the host's RSS always."""
    import psutil

    scalars = {"mem-rss-bytes": float(psutil.Process().memory_info().rss),
               "mem-max-rss-bytes": peak_rss_mib() * 2**20}
    module = _allocator(device_type)
    if module is not None:
        scalars["mem-allocated-bytes"] = float(module.memory_allocated())
        scalars["mem-max-allocated-bytes"] = float(module.max_memory_allocated())
        scalars["mem-reserved-bytes"] = float(module.memory_reserved())
    return scalars
