"""CPU backend: route Megatron's CUDA device calls to the CPU.

Upstream: megatron-core and megatron.training call ``torch.cuda.*`` and create or move tensors with
``device='cuda'`` / ``.cuda()``, which fail on a CPU-only host. On the ``cpu`` backend one general
redirect replaces patching each call site: the ``torch.cuda`` functions Megatron uses get CPU
meanings (one device, no-op sync and streams, the CPU generator, zero allocator statistics), and
CUDA device arguments of factories, ``.to``/``.cuda`` become ``cpu``. ``torch.cuda.is_available()``
still says False. All goes through the patch manager (printed at start, undone by
``adaptor.teardown()``).
"""
from __future__ import annotations

import contextlib
import time

import torch

from adaptor.features import Feature
from adaptor.device_redirect import make_mapper, register_collective_backend, register_device_arguments

OWNER = __name__

def _tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    if memory_format is torch.preserve_format:
        return self
    return self.contiguous(memory_format=memory_format)


def _module_cuda(self, device=None):
    return self


class _Event:
    """torch.cuda.Event on CPU: records wall time, so elapsed_time() still means something."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
        self._t = None

    def record(self, stream=None):
        self._t = time.perf_counter()

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end._t - self._t) * 1000.0


class _Stream(torch.cpu.Stream):
    """torch.cuda.Stream on CPU: work is already ordered, so every wait is a no-op."""

    def __new__(cls, device=None, priority=0, **kwargs):
        return super().__new__(cls)

    def __init__(self, device=None, priority=0, **kwargs):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def record_event(self, event=None):
        event = event or _Event()
        event.record(self)
        return event

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass


_DEFAULT_STREAM = _Stream()


class _DeviceProperties:
    name = "cpu"
    major = 0
    minor = 0
    multi_processor_count = 0

    @property
    def total_memory(self):
        import psutil

        return psutil.virtual_memory().total


def _const(name: str, value):
    """A distinct function per name: torch._dynamo indexes torch.cuda.* by object identity."""

    def fn(*args, **kwargs):
        return value() if callable(value) else value

    fn.__name__ = fn.__qualname__ = name
    return fn


def _mem_get_info(device=None):
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


def _manual_seed(seed):
    torch.default_generator.manual_seed(int(seed))


def _get_cpu_rng_state(device="cuda"):
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state, device="cuda"):
    torch.set_rng_state(new_state)


def _current_stream(device=None):
    return _DEFAULT_STREAM


def _stream(stream=None):
    return contextlib.nullcontext(stream)


_NOOPS = ("set_device", "synchronize", "empty_cache", "ipc_collect", "reset_peak_memory_stats",
          "reset_max_memory_allocated",
          # torch.manual_seed() itself calls torch.cuda.manual_seed_all(): keep it a no-op.
          "manual_seed_all")
_ZEROS = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")


def _cuda_namespace() -> dict:
    """Replacements for torch.cuda.<name> on the CPU backend."""
    table = {name: _const(name, None) for name in _NOOPS}
    table.update({name: _const(name, 0) for name in _ZEROS})
    table.update({
        "current_device": _const("current_device", 0),
        "device_count": _const("device_count", 1),
        "memory_stats": _const("memory_stats", dict),
        "get_device_capability": _const("get_device_capability", (0, 0)),
        "get_device_name": _const("get_device_name", "cpu"),
        "get_device_properties": _const("get_device_properties", _DeviceProperties),
        "get_rng_state": _get_cpu_rng_state,
        "set_rng_state": _set_cpu_rng_state,
        "manual_seed": _manual_seed,
        "mem_get_info": _mem_get_info,
        "Stream": _Stream,
        "Event": _Event,
        "current_stream": _current_stream,
        "default_stream": _const("default_stream", _DEFAULT_STREAM),
        "stream": _stream,
    })
    return table


def _get_rng_state(device="cuda", clone=False, graph_safe=False):
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


class CpuDevice(Feature):
    name = "cpu_device"
    backends = ("cpu",)

    def register_patches(self, pm, ctx) -> None:
        for name, fn in _cuda_namespace().items():
            pm.register_replacement(f"torch.cuda.{name}", fn, OWNER)
        register_device_arguments(pm, OWNER, make_mapper("cpu"))
        register_collective_backend(pm, OWNER, ctx.backend.dist_backend)
        pm.register_replacement("torch.Tensor.cuda", _tensor_cuda, OWNER)
        pm.register_replacement("torch.nn.Module.cuda", _module_cuda, OWNER)
        # Megatron's RNG tracker reads/writes the CUDA generator directly; use the CPU one.
        pm.register_replacement("megatron.core.tensor_parallel.random._get_cuda_rng_state", _get_rng_state, OWNER)
        pm.register_replacement("megatron.core.tensor_parallel.random._set_cuda_rng_state", _set_rng_state, OWNER)
