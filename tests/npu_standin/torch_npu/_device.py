"""The stand-in's ``torch.npu`` device API, its ``npu`` tensors and its ``hccl`` process groups.

Device API, as torch_npu documents it (``docs/context/NPU-Device.md`` and
``Random-Number-Generator.md`` of Ascend/op-plugin; it mirrors ``torch.cuda``): ``device_count()`` devices
(``STANDIN_NPU_DEVICE_COUNT``, default 8 as on an Atlas 800T A2), a current device index that
``set_device`` changes and ``current_device`` reports, and one RNG state per device index:
``get_rng_state(device='npu')`` / ``set_rng_state(state, device='npu')`` / ``manual_seed`` act on
the current device unless an index is given, ``manual_seed_all`` on every device. A call with a
wrong index, or reading device 0's state while running on device 1, gives a different state, as on
a real host, so device-index mistakes show.

What cannot be real without a device: an ``npu`` tensor is a CPU tensor. Factories and ``.to()``
map ``npu``/``npu:i`` to ``cpu``, and ``.npu()`` returns the CPU object. The current device's RNG
state is torch's CPU generator (so dropout on these tensors draws from it); the other devices'
states are kept here and swapped in by ``set_device``. ``hccl`` process groups are gloo groups.
"""
from __future__ import annotations

import functools
import os
import sys
import time
import types

import torch

from torch_npu._calls import record as _record

DEFAULT_DEVICE_COUNT = 8


class _Devices:
    def __init__(self, count: int):
        self.count = count
        self.current = 0
        seeded = torch.Generator()
        seeded.manual_seed(torch.initial_seed())
        self.fresh = seeded.get_state()  # a device's generator before anyone seeds it
        self.states: dict[int, torch.Tensor] = {}

    def index(self, device) -> int:
        if device is None or device == -1:
            return self.current
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "npu":
                raise ValueError(f"Expected a npu device, but got: {device}")
            return self.current if device.index is None else device.index
        if isinstance(device, int):
            return device
        raise TypeError(f"invalid device argument {device!r}")

    def check(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise RuntimeError(f"Invalid device ID {index}: {self.count} NPU devices (torch_npu stand-in)")
        return index

    def get_state(self, index: int) -> torch.Tensor:
        if index == self.current:
            return torch.get_rng_state()
        return self.states.get(index, self.fresh).clone()

    def set_state(self, index: int, state: torch.Tensor) -> None:
        if index == self.current:
            torch.set_rng_state(state)
        else:
            self.states[index] = state.clone()

    def switch(self, index: int) -> None:
        if index != self.current:
            self.states[self.current] = torch.get_rng_state()
            torch.set_rng_state(self.states.pop(index, self.fresh))
            self.current = index


DEVICES = _Devices(int(os.environ.get("STANDIN_NPU_DEVICE_COUNT", DEFAULT_DEVICE_COUNT)))


class Event:
    def __init__(self, *args, **kwargs):
        _record("Event", args, kwargs)
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0


class Stream:
    def __init__(self, *args, **kwargs):
        _record("Stream", args, kwargs)

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self):
        pass

    def is_capturing(self):
        return False  # no graph capture here (torch's optimizers ask before step())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _recorded(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _record(fn.__name__, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


@_recorded
def is_available():
    return DEVICES.count > 0


@_recorded
def device_count():
    return DEVICES.count


@_recorded
def current_device():
    return DEVICES.current


@_recorded
def set_device(device):
    DEVICES.switch(DEVICES.check(DEVICES.index(device)))


@_recorded
def get_rng_state(device="npu"):
    return DEVICES.get_state(DEVICES.check(DEVICES.index(device)))


@_recorded
def set_rng_state(new_state, device="npu"):
    DEVICES.set_state(DEVICES.check(DEVICES.index(device)), new_state)


def _seeded(seed: int) -> torch.Tensor:
    return torch.Generator().manual_seed(int(seed)).get_state()


@_recorded
def manual_seed(seed):
    DEVICES.set_state(DEVICES.current, _seeded(seed))


@_recorded
def manual_seed_all(seed):
    for index in range(DEVICES.count):
        DEVICES.set_state(index, _seeded(seed))


@_recorded
def get_rng_state_all():
    return [DEVICES.get_state(i) for i in range(DEVICES.count)]


@_recorded
def set_rng_state_all(new_states):
    for index, state in enumerate(new_states):
        DEVICES.set_state(index, state)


@_recorded
def synchronize(device=None):
    pass


@_recorded
def empty_cache():
    pass


@_recorded
def current_stream(device=None):
    return Stream()


def _zero(*args, **kwargs):
    return 0


def _module() -> types.ModuleType:
    npu = types.ModuleType("torch_npu.npu")
    for fn in (is_available, device_count, current_device, set_device, get_rng_state, set_rng_state,
               get_rng_state_all, set_rng_state_all, manual_seed, manual_seed_all, synchronize, empty_cache,
               current_stream):
        setattr(npu, fn.__name__, fn)
    npu.default_stream = current_stream
    npu.stream = lambda stream=None: stream or Stream()
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(npu, name, _zero)  # no device memory to count
    npu.reset_peak_memory_stats = lambda *a, **k: None
    npu.Stream, npu.Event = Stream, Event
    return npu


# ------------------------------------------------------------------------------- npu -> cpu
FACTORIES = (
    "tensor", "as_tensor", "empty", "empty_like", "empty_strided", "zeros", "zeros_like",
    "ones", "ones_like", "full", "full_like", "arange", "linspace", "logspace", "eye",
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
)


def _host(device):
    """An npu device spec as the CPU device the stand-in keeps its tensors on; others unchanged."""
    if isinstance(device, str) and (device == "npu" or device.startswith("npu:")):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "npu":
        if device.index is not None:
            DEVICES.check(device.index)
        return torch.device("cpu")
    return device


def _factory(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


def _to(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if args and isinstance(args[0], (str, torch.device)):
            args = (_host(args[0]),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"])
        return fn(self, *args, **kwargs)

    return wrapper


def _tensor_npu(self, device=None, non_blocking=False, **kwargs):
    _record("Tensor.npu", (device,), {"non_blocking": non_blocking, **kwargs})
    _host(torch.device("npu", device) if isinstance(device, int) else device)
    return self


def _pin_memory(self, device=None):
    return self


def _module_npu(self, device=None):
    _record("Module.npu", (device,), {})
    return self


def _hccl(store, rank, world_size, timeout):
    return torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """What torch's accelerator queries (``torch._C._get_accelerator``, barrier) need of a PrivateUse1 backend."""

    def is_available(self):
        return DEVICES.count > 0

    def is_built(self):
        return True

    def has_primary_context(self, index):
        return index == DEVICES.current


def install() -> types.ModuleType:
    """Register the ``npu`` device name, ``torch.npu``, the npu->cpu mapping and ``hccl``."""
    torch.utils.rename_privateuse1_backend("npu")
    install.hooks = _Hooks()  # kept alive: torch holds only a pointer
    torch._C._acc.register_python_privateuseone_hook(install.hooks)
    npu = _module()
    torch.npu = npu
    sys.modules["torch.npu"] = npu  # torch's accelerator API imports it by this name
    for name in FACTORIES:
        setattr(torch, name, _factory(getattr(torch, name)))
    torch.Tensor.to = _to(torch.Tensor.to)
    torch.nn.Module.to = _to(torch.nn.Module.to)
    torch.Tensor.npu = _tensor_npu
    # torch's device-generic API asks the PrivateUse1 device guard, which only C++ can provide.
    torch.accelerator.current_device_index = current_device
    torch.accelerator.current_device_idx = current_device
    torch.accelerator.set_device_index = set_device
    torch.accelerator.set_device_idx = set_device
    torch.accelerator.device_count = device_count
    torch.accelerator.current_stream = current_stream
    torch.Tensor.pin_memory = _pin_memory  # host memory is all there is
    torch.nn.Module.npu = _module_npu
    if torch.distributed.is_available() and "hccl" not in torch.distributed.Backend.backend_list:
        torch.distributed.Backend.register_backend("hccl", _hccl, devices=["cpu"])
    return npu
