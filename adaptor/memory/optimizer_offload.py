"""Adam that keeps a chosen fraction of its parameters' fp32 master copies and moments in host memory.

:class:`HostOffloadAdam` is a ``torch.optim.AdamW`` over the same parameter groups as the optimizer it
replaces, so Megatron's wrappers (FP32, Float16, Distributed) and checkpoint code see torch's layout:
``state[param]`` holds ``step``, ``exp_avg`` and ``exp_avg_sq`` for every parameter. For the offloaded
parameters (the first ``fraction`` of all elements, in parameter-group order) those moments are host
tensors, the fp32 master copy lives on the host too, and the update runs there with a second torch
Adam of the same hyper-parameters: the gradient goes device -> host first, the updated master goes
host -> device after. The device parameter is the mirror the wrapper copies into the model; the host
copy is re-read from it after a checkpoint load (:meth:`mark_stale`) and before the first step.

Host buffers are always separate allocations filled with ``copy_`` (never ``.cpu()``, which returns
the tensor itself when it already is a CPU tensor), so the mechanism is real on the CPU backend too.
"""
from __future__ import annotations

import weakref

import torch

_instances: "weakref.WeakSet[HostOffloadAdam]" = weakref.WeakSet()


def mark_all_stale() -> None:
    """Every offloading optimizer re-reads its host master copies from the device before its next step."""
    for opt in list(_instances):
        opt.mark_stale()


def offloaded_prefix(numels: list[int], fraction: float) -> int:
    """How many leading parameters hold the element count closest to ``fraction`` of all elements."""
    target = fraction * sum(numels)
    taken = count = 0
    for n in numels:
        if taken + n / 2 >= target:  # this parameter would take us further from the target
            break
        taken += n
        count += 1
    return count


class _Copier:
    """Device <-> host copies on a side stream where the device has streams, synchronous otherwise."""

    def __init__(self, device_type: str, overlap: bool) -> None:
        module = getattr(torch, device_type, None) if device_type in ("cuda", "npu") else None
        self.module = module
        self.overlap = overlap and module is not None
        self.stream = module.Stream() if module is not None else None

    def to_host(self, pairs) -> object:
        """Start copying each (device, host) pair; returns what :meth:`wait` needs."""
        if self.module is None:
            for src, dst in pairs:
                dst.copy_(src)
            return None
        self.stream.wait_stream(self.module.current_stream())
        with self.module.stream(self.stream):
            for src, dst in pairs:
                dst.copy_(src, non_blocking=True)
            done = self.module.Event()
            done.record(self.stream)
        return done

    @staticmethod
    def wait(done) -> None:
        if done is not None:
            done.synchronize()

    def to_device(self, pairs) -> None:
        if self.module is None:
            for src, dst in pairs:
                dst.copy_(src)
            return
        with self.module.stream(self.stream):
            for src, dst in pairs:
                dst.copy_(src, non_blocking=True)
            done = self.module.Event()
            done.record(self.stream)
        if self.overlap:
            self.module.current_stream().wait_event(done)  # later device work waits; the host goes on
        else:
            done.synchronize()


class HostOffloadAdam(torch.optim.AdamW):
    """torch's Adam/AdamW whose first ``fraction`` of elements is stepped in host memory."""

    def __init__(self, param_groups, *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, decoupled_weight_decay: bool, fraction: float, device_type: str,
                 pin_grads: bool = True, pin_params: bool = True, overlap: bool = False) -> None:
        torch.optim.Optimizer.__init__(self, param_groups, dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False, maximize=False,
            foreach=None, capturable=False, differentiable=False, fused=None,
            decoupled_weight_decay=decoupled_weight_decay))
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"offload fraction {fraction} is outside [0, 1]")
        self.fraction = fraction
        pinnable = device_type in ("cuda", "npu")
        self._pin_grads = pin_grads and pinnable
        self._pin_params = pin_params and pinnable
        self._copier = _Copier(device_type, overlap)
        self._plan_key: tuple | None = None
        self._offloaded: list[list[torch.Tensor]] = []  # per group
        self._master: dict[torch.Tensor, torch.Tensor] = {}
        self._grad: dict[torch.Tensor, torch.Tensor] = {}
        self._host: torch.optim.Adam | None = None
        self._stale = True
        self.last_host_elements = 0  # elements the last step updated on the host
        self.after_first_step = None  # called once with last_host_elements
        _instances.add(self)

    def add_param_group(self, param_group: dict) -> None:
        """torch's, for the tensors Megatron's wrappers step, which need not be leaves.

        The distributed optimizer's fp32 parameters are stepped through views of the model parameters
        (``model_param.view(-1)[start:end]``), which autograd records as non-leaf tensors; Megatron
        installs them into its own optimizer by assigning ``param_groups``, past torch's leaf check, and
        steps them in place under ``no_grad``, as this optimizer does. torch checks detached aliases
        here (same storage, leaves), and the group keeps the wrapper's own tensors, which receive the gradients.
        """
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        param_group["params"] = [p if p.is_leaf else p.detach() for p in params]
        super().add_param_group(param_group)
        param_group["params"] = params

    # -- the plan: which parameters live on the host -------------------------------------------

    def offloaded_params(self) -> list[torch.Tensor]:
        self._plan()
        return [p for group in self._offloaded for p in group]

    def _plan(self) -> None:
        key = tuple(id(p) for g in self.param_groups for p in g["params"])
        if key == self._plan_key:
            return
        params = [p for g in self.param_groups for p in g["params"]]
        chosen = set(map(id, params[:offloaded_prefix([p.numel() for p in params], self.fraction)]))
        self._offloaded = [[p for p in g["params"] if id(p) in chosen] for g in self.param_groups]
        self._master = {p: self._host_buffer(p, self._pin_params) for group in self._offloaded for p in group}
        self._grad = {p: self._host_buffer(p, self._pin_grads) for group in self._offloaded for p in group}
        self._host = torch.optim.Adam(
            [{**{k: v for k, v in g.items() if k != "params"}, "params": [self._master[p] for p in group]}
             for g, group in zip(self.param_groups, self._offloaded)])
        self._plan_key = key
        self._stale = True

    @staticmethod
    def _host_buffer(like: torch.Tensor, pin: bool) -> torch.Tensor:
        buf = torch.empty(like.shape, dtype=torch.float32, device="cpu")
        return buf.pin_memory() if pin else buf

    def mark_stale(self) -> None:
        """The device copies changed outside a step (a checkpoint load): re-read them before the next step."""
        self._stale = True

    def _to_host_state(self) -> None:
        """State tensors of offloaded parameters that are not host tensors (a load, init_state_fn) move there."""
        for p in self._master:
            state = self.state.get(p)
            if not state:
                continue
            for k, v in state.items():
                if torch.is_tensor(v) and v.device.type != "cpu":  # the step counter too: the host steps
                    host = torch.empty(v.shape, dtype=v.dtype, device="cpu")
                    host.copy_(v)
                    state[k] = host

    # -- torch.optim interface -----------------------------------------------------------------

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._plan()
        self._to_host_state()
        self._stale = True

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._plan()
        if self._stale:
            self._copier.wait(self._copier.to_host([(p.detach(), self._master[p]) for p in self._master]))
            self._stale = False
        self._to_host_state()
        with_grad = [p for p in self._master if p.grad is not None]
        copied = self._copier.to_host([(p.grad.detach(), self._grad[p]) for p in with_grad])
        # Device part: torch's own step over the parameters that stay on the device.
        everything = [g["params"] for g in self.param_groups]
        try:
            for g, group in zip(self.param_groups, self._offloaded):
                offloaded = set(map(id, group))
                g["params"] = [p for p in g["params"] if id(p) not in offloaded]
            super().step()
        finally:
            for g, params in zip(self.param_groups, everything):
                g["params"] = params
        # Host part: the same torch Adam on the host master copies and host moments.
        self._copier.wait(copied)
        for g, hg, group in zip(self.param_groups, self._host.param_groups, self._offloaded):
            hg.update({k: v for k, v in g.items() if k != "params"}, params=hg["params"])
            for p in group:
                master = self._master[p]
                master.grad = self._grad[p] if p.grad is not None else None
                self._host.state[master] = self.state[p]  # one state dict: what state_dict() saves
        self._host.step()
        self.last_host_elements = sum(p.numel() for p in with_grad)
        self._copier.to_device([(self._master[p], p.detach()) for p in with_grad])
        if self.after_first_step is not None:
            report, self.after_first_step = self.after_first_step, None
            report(self.last_host_elements)
        return loss
