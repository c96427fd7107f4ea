"""Megatron's tensor-parallel linears with LoRA adapters: ``y = base(x) + scaling * B(A(dropout(x)))``.

The spec builds :class:`LoraColumnParallelLinear` / :class:`LoraRowParallelLinear` for megatron-core's
``ColumnParallelLinear`` / ``RowParallelLinear``; a linear gets adapters only when its
``tp_comm_buffer_name`` maps (:data:`TARGETS`) to a module of the active :class:`LoraConfig`.

Parallel layout (the linear's ``tp_group``, the expert TP group for experts): column-parallel
``lora_A [r, in]`` replicated (its gradient summed over the group), ``lora_B [out/tp, r]`` split like
the weight; row-parallel ``lora_A [r, in/tp]`` split, ``lora_B [out, r]`` replicated, ``A x`` summed
over the group (and split along the sequence under sequence parallelism). With
``explicit_expert_comm`` the dispatcher does the reductions, so the adapters leave them to it.

Initialisation as PEFT's (A kaiming-uniform a = sqrt(5) from the full matrix, B zeros); a training
run redraws A from ``--seed`` and the linear's place (:func:`adaptor.lora.model.initialize_adapters`)
so every TP/PP/EP layout and device starts from the same adapters. Adapters take the parameters' dtype.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    set_tensor_model_parallel_attributes,
)
from megatron.core.tensor_parallel.mappings import (
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)

from adaptor.lora import DEFAULT_TARGETS, TARGETS


@dataclass(frozen=True)
class LoraConfig:
    r: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    @classmethod
    def from_args(cls, args) -> Optional["LoraConfig"]:
        """The run's adapters (``--lora-r`` & co.), or None when LoRA is off."""
        if not getattr(args, "lora_r", None):
            return None
        return cls(int(args.lora_r), float(args.lora_alpha), float(args.lora_dropout or 0.0),
                   tuple(args.lora_target_modules or DEFAULT_TARGETS))


_active: Optional[LoraConfig] = None


@contextlib.contextmanager
def building(config: Optional[LoraConfig]) -> Iterator[None]:
    """Linears built inside the block get the adapters ``config`` targets (None: none)."""
    global _active
    previous, _active = _active, config
    try:
        yield
    finally:
        _active = previous


class AdapterLinear(torch.nn.Linear):
    """``lora_A`` / ``lora_B``: a bias-free ``torch.nn.Linear`` whose weight its owner fills (no init of its own,
    so building one draws nothing from the random generators)."""

    def reset_parameters(self) -> None:
        pass


class _ReplicatedInputDown(torch.autograd.Function):
    """``x @ A.T`` for an input every rank of ``group`` holds whole; the ranks' partial gradients of the
    output are summed in backward, so A's gradient is complete on each rank. The input's gradient is
    complete too, or, with ``partial_input_grad`` (someone downstream sums the ranks' input gradients),
    this rank's part only."""

    @staticmethod
    def forward(ctx, x, weight, group, partial_input_grad):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.partial_input_grad = group, partial_input_grad
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        summed = grad_output
        if ctx.group is not None and ctx.group.size() > 1:
            summed = grad_output.contiguous().clone()
            torch.distributed.all_reduce(summed, group=ctx.group)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_output if ctx.partial_input_grad else summed).matmul(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = summed.reshape(-1, summed.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
        return grad_x, grad_weight, None, None


class _FirstRankOnly(torch.autograd.Function):
    """The value on the group's first rank, zeros elsewhere; the gradient passes unchanged (every rank
    receives the gradient of the ranks' sum, which is what the value contributes to)."""

    @staticmethod
    def forward(ctx, x, group):
        return x if group is None or group.rank() == 0 else torch.zeros_like(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


def _kaiming_a(r: int, fan_in: int, device, dtype, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """PEFT's init of lora_A, on the full ``[r, fan_in]`` matrix (on the CPU when ``generator`` is given)."""
    master = torch.empty(r, fan_in, dtype=torch.float32, device="cpu" if generator is not None else device)
    torch.nn.init.kaiming_uniform_(master, a=math.sqrt(5), generator=generator)
    return master.to(device=device, dtype=dtype)


class _LoraMixin:
    """What the column and row linears share: the adapters' attributes, merging, the state-dict layout."""

    lora_A: Optional[AdapterLinear]
    lora_B: Optional[AdapterLinear]

    def _no_adapters(self) -> None:
        self.lora_A = self.lora_B = None
        self.lora_target = None
        self.lora_r = 0
        self.lora_alpha = 0.0
        self.lora_scaling = 0.0
        self.lora_merged = False

    def _adapter_config(self, lora: Optional[LoraConfig], buffer_name: Optional[str]) -> Optional[LoraConfig]:
        self._no_adapters()
        config = lora if lora is not None else _active
        target = TARGETS.get(buffer_name or "")
        self.lora_module_name = target  # the --lora-target-modules name of this linear (None: not adaptable)
        if config is None or target not in config.targets or self.weight is None:
            return None
        self.lora_target = target
        self.lora_r, self.lora_alpha = int(config.r), float(config.alpha)
        self.lora_scaling = config.alpha / config.r
        self.lora_dropout = torch.nn.Dropout(config.dropout) if config.dropout > 0 else torch.nn.Identity()
        return config

    def _make_adapters(self, a: torch.Tensor, b: torch.Tensor, a_split_dim: Optional[int],
                       b_split_dim: Optional[int]) -> None:
        device, dtype = self.weight.device, self.weight.dtype
        self.lora_A = AdapterLinear(a.shape[1], a.shape[0], bias=False, device=device, dtype=dtype)
        self.lora_B = AdapterLinear(b.shape[1], b.shape[0], bias=False, device=device, dtype=dtype)
        allreduce = getattr(self.weight, "allreduce", True)
        for module, value, dim in ((self.lora_A, a, a_split_dim), (self.lora_B, b, b_split_dim)):
            with torch.no_grad():
                module.weight.copy_(value)
            if dim is not None:
                set_tensor_model_parallel_attributes(module.weight, is_parallel=True, dim=dim, stride=1)
            setattr(module.weight, "allreduce", allreduce)  # experts: reduced over the expert data-parallel group

    @property
    def has_adapters(self) -> bool:
        return self.lora_A is not None

    @torch.no_grad()
    def reset_adapters(self, generator: Optional[torch.Generator] = None) -> None:
        """PEFT's initialisation again: A kaiming-uniform drawn from ``generator`` (a CPU generator; None:
        the default one of the weight's device), B zeros."""
        a, b = self._initial_adapters(self.lora_r, generator)
        self.lora_A.weight.copy_(a)
        self.lora_B.weight.copy_(b)

    # -- merged weights, for exporters ---------------------------------------------------------------
    def lora_delta(self) -> torch.Tensor:
        """``scaling * B @ A`` on this rank, in the local shape of the base weight (fp32)."""
        if not self.has_adapters:
            raise ValueError("this linear has no LoRA adapters")
        return self.lora_scaling * (self.lora_B.weight.float() @ self.lora_A.weight.float())

    @torch.no_grad()
    def merge_(self) -> None:
        """Add the adapters into the base weight; forward then skips them (until :meth:`unmerge_`)."""
        if self.has_adapters and not self.lora_merged:
            self.weight.copy_(self.weight.float() + self.lora_delta())  # summed in fp32, rounded once
            self.lora_merged = True

    @torch.no_grad()
    def unmerge_(self) -> None:
        """Take the adapters out of the base weight again (exact in fp32 up to one rounding per element)."""
        if self.has_adapters and self.lora_merged:
            self.weight.copy_(self.weight.float() - self.lora_delta())
            self.lora_merged = False

    def _lora_active(self) -> bool:
        # lora_disabled: DPO's reference forward (adaptor.preference.reference.adapters_disabled)
        return self.has_adapters and not self.lora_merged and not getattr(self, "lora_disabled", False)

    def _rng_fork(self):
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name

        tracker = get_cuda_rng_tracker()
        return tracker.fork(get_expert_parallel_rng_tracker_name()) if self.is_expert else tracker.fork()

    def _sharded(self, prefix, sharded_offsets, metadata, axes: dict):
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        state_dict = self.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(state_dict, prefix, axes, sharded_offsets,
                                                   tp_group=self.tp_group, dp_cp_group=metadata["dp_cp_group"])

    def extra_repr(self) -> str:
        base = super().extra_repr()
        if not self.has_adapters:
            return base
        return f"{base}, lora_r={self.lora_r}, lora_alpha={self.lora_alpha:g}"


class LoraColumnParallelLinear(_LoraMixin, ColumnParallelLinear):
    """``ColumnParallelLinear`` with a replicated ``lora_A`` and a row-split ``lora_B`` when targeted."""

    def __init__(self, input_size, output_size, *, config, init_method, tp_comm_buffer_name=None,
                 lora: Optional[LoraConfig] = None, **kwargs):
        super().__init__(input_size, output_size, config=config, init_method=init_method,
                         tp_comm_buffer_name=tp_comm_buffer_name, **kwargs)
        self.lora_gated_rows = bool(tp_comm_buffer_name == "fc1" and getattr(config, "gated_linear_unit", False))
        settings = self._adapter_config(lora, tp_comm_buffer_name)
        if settings is None:
            return
        self._make_adapters(*self._initial_adapters(settings.r), a_split_dim=None, b_split_dim=0)

    def _initial_adapters(self, r, generator=None):
        a = _kaiming_a(r, self.input_size, self.weight.device, self.weight.dtype, generator)
        return a, torch.zeros(self.output_size_per_partition, r, device=self.weight.device, dtype=self.weight.dtype)

    def forward(self, input_, weight=None, runtime_gather_output=None):
        output, output_bias = super().forward(input_, weight, runtime_gather_output)
        if not self._lora_active():
            return output, output_bias
        delta = self._lora_forward(input_)
        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        if gather:
            delta = gather_from_tensor_model_parallel_region(delta, group=self.tp_group)
        return output + delta, output_bias

    def _lora_forward(self, x):
        partial_input_grad = self.explicit_expert_comm or self.disable_grad_reduce
        if self.sequence_parallel and not self.explicit_expert_comm:
            x = gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False, group=self.tp_group)
        x = self.lora_dropout(x)  # the input is the same on every rank, and so is the default generator
        u = _ReplicatedInputDown.apply(x, self.lora_A.weight, self.tp_group, partial_input_grad)
        return F.linear(u, self.lora_B.weight) * self.lora_scaling

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        if not self.has_adapters:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        sharded = self._sharded(prefix, sharded_offsets, metadata, {"weight": 0, "bias": 0, "lora_B.weight": 0})
        if self.lora_gated_rows:
            # SwiGLU's fc1 holds [gate rows; up rows] of its rank: lora_B's rows are laid out the same way, so
            # they are stored as the MLP stores the weight (two halves), and reshard across TP alike.
            from megatron.core.transformer import mlp

            key = f"{prefix}lora_B.weight"
            sharded[key] = mlp.apply_swiglu_sharded_factory(
                sharded[key], sharded_offsets, (metadata or {}).get("singleton_local_shards", False),
                tp_group=self.tp_group, dp_group=metadata["dp_cp_group"])
        return sharded


class LoraRowParallelLinear(_LoraMixin, RowParallelLinear):
    """``RowParallelLinear`` with a column-split ``lora_A`` and a replicated ``lora_B`` when targeted."""

    def __init__(self, input_size, output_size, *, config, init_method, tp_comm_buffer_name=None,
                 lora: Optional[LoraConfig] = None, **kwargs):
        super().__init__(input_size, output_size, config=config, init_method=init_method,
                         tp_comm_buffer_name=tp_comm_buffer_name, **kwargs)
        settings = self._adapter_config(lora, tp_comm_buffer_name)
        if settings is None:
            return
        self._make_adapters(*self._initial_adapters(settings.r), a_split_dim=1, b_split_dim=None)

    def _initial_adapters(self, r, generator=None):
        rank = self.tp_group.rank() if self.tp_group is not None else 0
        width = self.input_size_per_partition
        full_a = _kaiming_a(r, self.input_size, self.weight.device, self.weight.dtype, generator)
        a = full_a[:, rank * width:(rank + 1) * width].contiguous()
        return a, torch.zeros(self.output_size, r, device=self.weight.device, dtype=self.weight.dtype)

    def forward(self, input_):
        output, output_bias = super().forward(input_)
        if not self._lora_active():
            return output, output_bias
        x = input_ if self.input_is_parallel else scatter_to_tensor_model_parallel_region(input_, group=self.tp_group)
        if isinstance(self.lora_dropout, torch.nn.Dropout) and self.training:
            with self._rng_fork():  # each rank holds its own slice of the input
                x = self.lora_dropout(x)
        u = reduce_from_tensor_model_parallel_region(F.linear(x, self.lora_A.weight), group=self.tp_group)
        delta = F.linear(u, self.lora_B.weight) * self.lora_scaling
        if self.explicit_expert_comm:
            delta = _FirstRankOnly.apply(delta, self.tp_group)
        elif self.sequence_parallel:
            delta = scatter_to_sequence_parallel_region(delta, group=self.tp_group)
        return output + delta, output_bias

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        if not self.has_adapters:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        return self._sharded(prefix, sharded_offsets, metadata, {"weight": 1, "lora_A.weight": 1})
