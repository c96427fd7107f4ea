"""Activation offload: the tensors a module saves for backward wait in host memory instead.

While an offloaded module runs forward, ``torch.autograd.graph.saved_tensors_hooks`` copies each
saved tensor of at least ``min_numel`` elements that is not a leaf (parameters, masks, rotary tables,
a stage's received input) to host memory; autograd keeps a :class:`_Offloaded` handle and backward
copies it back. With streams (``torch.cuda``, ``torch.npu``) copies use pinned memory on a side
stream ordered by events, and the previous layer's tensors are prefetched when backward reaches a
module. On the CPU backend the copy runs but frees nothing (:func:`describe` says so). Handles
belong to one module call, so pipelined micro-batches share nothing; nothing is offloaded inside
backward (recompute).
"""
from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field

import torch


class _Streams:
    """The device's stream API (``torch.cuda`` or ``torch.npu``), or none on CPU."""

    def __init__(self, device_type: str) -> None:
        self.api = getattr(torch, device_type, None) if device_type in ("cuda", "npu") else None
        self.side = self.api.Stream() if self.api is not None else None

    def current(self):
        return self.api.current_stream()

    def event(self):
        return self.api.Event()


@dataclass
class _Group:
    """The tensors one call of one module offloaded."""

    name: str
    previous: "_Group | None" = None
    handles: list = field(default_factory=list)
    copied_out: object = None  # event after the group's device-to-host copies
    prefetched: bool = False


class _Offloaded:
    """What autograd keeps instead of a saved tensor."""

    __slots__ = ("host", "device", "group", "device_tensor", "ready")

    def __init__(self, host: torch.Tensor, device: torch.device, group: _Group, device_tensor) -> None:
        self.host = host
        self.device = device
        self.group = group
        self.device_tensor = device_tensor  # held only until the copy to host is done
        self.ready = None  # (tensor, event) once prefetched


def is_offloadable(tensor: torch.Tensor, min_numel: int, device_is_host: bool) -> bool:
    """A saved activation worth moving: large enough, on the device, not a parameter or other leaf."""
    if tensor.numel() < max(min_numel, 1) or tensor.layout != torch.strided:
        return False
    if tensor.device.type == "cpu" and not device_is_host:
        return False  # already in host memory
    if tensor.is_leaf or (tensor._base is not None and tensor._base.is_leaf):
        return False  # parameters and their views, masks, rotary tables, received inputs: alive anyway
    return True


class ActivationOffloader:
    """Moves the saved tensors of chosen modules to host memory and back; counts bytes per module name."""

    def __init__(self, device_type: str, min_numel: int) -> None:
        self.device = torch.device(device_type)
        self.min_numel = min_numel
        # The CPU backend, and a device that keeps its tensors in host memory, free nothing by offloading.
        self.device_is_host = torch.empty(0, device=self.device).device.type == "cpu"
        self.streams = _Streams(device_type)
        self.pin = self.streams.api is not None and not self.device_is_host
        self.bytes = collections.Counter()  # module name -> bytes offloaded
        self.packed = 0
        self.unpacked = 0
        self._open: list[tuple[_Group, contextlib.AbstractContextManager]] = []
        self._last_in_pass: _Group | None = None

    def describe(self) -> str:
        size = f"saved tensors of >= {self.min_numel} elements"
        if self.device_is_host:
            return (f"activation offload: {size} are copied to host memory and back, which saves no device "
                    f"memory here: this device's memory is host memory")
        return f"activation offload: {size} go to pinned host memory, copied on a side {self.device.type} stream"

    # -- the module's forward -----------------------------------------------------------------
    def new_pass(self) -> None:
        """A forward pass over a stack of layers begins: prefetch links start afresh."""
        self._last_in_pass = None

    def enter(self, name: str) -> None:
        group = _Group(name, previous=self._last_in_pass)
        self._last_in_pass = group
        hooks = torch.autograd.graph.saved_tensors_hooks(
            lambda t: self._pack(t, group), self._unpack)
        hooks.__enter__()
        self._open.append((group, hooks))

    def exit(self) -> None:
        group, hooks = self._open.pop()
        hooks.__exit__(None, None, None)
        self._release(group)

    @contextlib.contextmanager
    def scope(self, name: str):
        self.enter(name)
        try:
            yield
        finally:
            self.exit()

    # -- the hooks ----------------------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor, group: _Group):
        if torch._C._current_graph_task_id() != -1:  # recomputation inside backward: used at once
            return tensor
        if not is_offloadable(tensor, self.min_numel, self.device_is_host):
            return tensor
        host = torch.empty_like(tensor, device="cpu", pin_memory=self.pin)  # strides kept where dense
        if self.streams.api is None:
            host.copy_(tensor)
            held = None
        else:
            made = self.streams.event()
            made.record(self.streams.current())
            self.streams.side.wait_event(made)
            with self.streams.api.stream(self.streams.side):
                host.copy_(tensor, non_blocking=True)
            held = tensor  # until the compute stream has waited for the copy (exit of the module)
        handle = _Offloaded(host, tensor.device, group, held)
        group.handles.append(handle)
        self.bytes[group.name] += tensor.numel() * tensor.element_size()
        self.packed += 1
        return handle

    def _release(self, group: _Group) -> None:
        if self.streams.api is not None and group.handles:
            group.copied_out = self.streams.event()
            group.copied_out.record(self.streams.side)
            self.streams.current().wait_event(group.copied_out)
        for handle in group.handles:
            handle.device_tensor = None

    def _unpack(self, packed):
        if not isinstance(packed, _Offloaded):
            return packed
        self.unpacked += 1
        group = packed.group
        if group.previous is not None and not group.previous.prefetched:
            self._prefetch(group.previous)
        group.prefetched = True
        if packed.ready is not None:
            tensor, event = packed.ready
            packed.ready = None
            self.streams.current().wait_event(event)
            return tensor
        return self._to_device(packed.host, packed.device)

    def _to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        tensor = torch.empty_like(host, device=device)
        tensor.copy_(host, non_blocking=self.pin)  # a real copy, also where the device is host memory
        return tensor

    def _prefetch(self, group: _Group) -> None:
        """Bring a module call's tensors back on the side stream, before backward asks for them."""
        group.prefetched = True
        if self.streams.api is None:
            return
        self.streams.side.wait_stream(self.streams.current())
        for handle in group.handles:
            if handle.ready is not None:
                continue
            tensor = torch.empty_like(handle.host, device=handle.device)
            with self.streams.api.stream(self.streams.side):
                tensor.copy_(handle.host, non_blocking=True)
                done = self.streams.event()
                done.record(self.streams.side)
            handle.ready = (tensor, done)

    def summary(self) -> str:
        parts = ", ".join(f"{name} {n / 2**20:.2f} MiB" for name, n in sorted(self.bytes.items()))
        return f"activation offload, first iteration: {parts or 'nothing'} offloaded to host memory"


def attach(module: torch.nn.Module, name: str, offloader: ActivationOffloader) -> None:
    """Offload what ``module`` saves during its forward, counted under ``name``."""

    def pre(mod, args):
        offloader.enter(name)

    def post(mod, args, output):
        offloader.exit()

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post, always_call=True)


def attach_between(first: torch.nn.Module, second: torch.nn.Module, name: str,
                   offloader: ActivationOffloader) -> None:
    """Offload what is saved after ``first`` returns and before ``second`` starts (an activation that
    runs inline between two linears), counted under ``name``."""
    first.register_forward_hook(lambda mod, args, output: offloader.enter(name))
    second.register_forward_pre_hook(lambda mod, args: offloader.exit())


def attach_pass_start(module: torch.nn.Module, offloader: ActivationOffloader) -> None:
    """A call of ``module`` (a stack of layers) starts a new forward pass for prefetching."""
    module.register_forward_pre_hook(lambda mod, args: offloader.new_pass())
