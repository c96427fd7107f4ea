"""STAND-IN for torch_npu — NOT Ascend's library. Used only by the tests.

No NPU exists on the machines this project is tested on. This package takes
torch_npu's place on ``sys.path`` in test subprocesses so the adaptor's NPU
code paths can run: it registers the ``npu`` device name with torch (as
torch_npu does, through the PrivateUse1 mechanism), installs ``torch.npu``
with the functions Megatron's calls are mapped to, and records every call in
``torch_npu.calls`` as ``(name, args, kwargs)``. Results are reference values
computed on the CPU (the CPU RNG state, index 0, ...), and ``Tensor.npu`` /
``Module.npu`` return the CPU object unchanged after recording the call.
"""
from __future__ import annotations

import time
import types

import torch

calls: list[tuple[str, tuple, dict]] = []
__version__ = "0.0.0+standin"

torch.utils.rename_privateuse1_backend("npu")


def _recorded(name, result):
    def fn(*args, **kwargs):
        calls.append((name, args, kwargs))
        return result(*args, **kwargs) if callable(result) else result

    fn.__name__ = fn.__qualname__ = name
    return fn


class Event:
    def __init__(self, *args, **kwargs):
        calls.append(("Event", args, kwargs))
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0


class Stream:
    def __init__(self, *args, **kwargs):
        calls.append(("Stream", args, kwargs))

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


npu = types.ModuleType("torch_npu.npu")
npu.is_available = _recorded("is_available", True)
npu.device_count = _recorded("device_count", 1)
npu.current_device = _recorded("current_device", 0)
npu.set_device = _recorded("set_device", None)
npu.synchronize = _recorded("synchronize", None)
npu.empty_cache = _recorded("empty_cache", None)
npu.get_rng_state = _recorded("get_rng_state", lambda *a, **k: torch.get_rng_state())
npu.set_rng_state = _recorded("set_rng_state", lambda state, *a, **k: torch.set_rng_state(state))
npu.manual_seed = _recorded("manual_seed", lambda seed: torch.default_generator.manual_seed(int(seed)))
npu.manual_seed_all = _recorded("manual_seed_all", None)
npu.memory_allocated = _recorded("memory_allocated", 0)
npu.max_memory_allocated = _recorded("max_memory_allocated", 0)
npu.current_stream = _recorded("current_stream", lambda *a, **k: Stream())
npu.Stream = Stream
npu.Event = Event

torch.npu = npu


def _tensor_npu(self, device=None, non_blocking=False, **kwargs):
    calls.append(("Tensor.npu", (device,), {"non_blocking": non_blocking, **kwargs}))
    return self


def _module_npu(self, device=None):
    calls.append(("Module.npu", (device,), {}))
    return self


torch.Tensor.npu = _tensor_npu
torch.nn.Module.npu = _module_npu

# Fused operators (torch_npu.npu_*), one stand-in file per group; each checks its arguments.
from torch_npu._standin_elementwise import *  # noqa: E402,F401,F403
from torch_npu._standin_attention import *  # noqa: E402,F401,F403
from torch_npu._standin_loss import *  # noqa: E402,F401,F403
from torch_npu._standin_moe import *  # noqa: E402,F401,F403
