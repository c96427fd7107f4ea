"""Megatron's ``TorchFullyShardedDataParallel`` rebuilt for every backend and for the YAML plan.

Upstream (megatron-core 0.19.2) builds its mesh as ``DeviceMesh.from_group(dp, "cuda")`` (fails on
CPU and NPU), wraps by class only and keeps ``--bf16`` parameters in bf16. :class:`FullyShardedModel`
subclasses it (Megatron's ``isinstance`` checks hold) and:

* meshes the data-parallel (x CP) group on the adaptor's device (dim ``dp``); with TP > 1 that gives
  the 2-D layout, TP slices sharded along dim 0;
* shards :func:`adaptor.fsdp2.plan.sharding_plan`'s units, then the root, prefetching
  ``num_to_forward_prefetch`` units;
* ``--bf16`` / ``--fp16``: shards are fp32 masters (widened from ``Float16Module``'s values), gathered
  as bf16 / fp16, gradients reduce-scattered in fp32; inputs are not cast (rotary frequencies stay
  fp32). fp16's loss scaling is the optimizer's: :mod:`adaptor.fsdp2.loss_scaling`;
* ``ignored_modules`` stay replicated: averaged in :meth:`finish_grad_sync`, counted once in the
  gradient norm (``shared``), fp32 compute under mixed precision;
* ``--calculate-per-token-loss``: summed gradients divided in :meth:`scale_gradients`, as DDP does.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map

from megatron.core import parallel_state
from megatron.core.distributed.data_parallel_base import _BaseDataParallel
from megatron.core.distributed.torch_fully_sharded_data_parallel import TorchFullyShardedDataParallel
from megatron.core.transformer.module import Float16Module

from adaptor.fsdp2.config import Fsdp2Config, Fsdp2ConfigError
from adaptor.fsdp2.plan import sharding_plan
from adaptor.fsdp2.recompute import checkpoint_forward


def device_type() -> str:
    from adaptor import run_state

    return run_state.backend().device_type


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _fallback_config(config, ddp_config) -> Fsdp2Config:
    """The plan when Megatron's training loop did not attach one (direct construction)."""
    return Fsdp2Config(reshard_after_forward=getattr(ddp_config, "reshard_after_forward", True),
                       param_dtype=(torch.bfloat16 if config.bf16 else torch.float16 if config.fp16
                                    else torch.float32),
                       reduce_dtype=torch.float32)


def _cast_floats(dtype):
    def cast(value):
        return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
    return cast


def _compute_in_fp32(module: torch.nn.Module, compute_dtype: torch.dtype) -> None:
    """An ignored module keeps fp32 weights: widen its inputs, narrow its outputs back."""
    widen, narrow = _cast_floats(torch.float32), _cast_floats(compute_dtype)
    module.register_forward_pre_hook(lambda m, args, kwargs: (tree_map(widen, args), tree_map(widen, kwargs)),
                                     with_kwargs=True)
    module.register_forward_hook(lambda m, args, output: tree_map(narrow, output))


def _names(pairs) -> str:
    return ", ".join(name for name, _ in pairs) or "none"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class FullyShardedModel(TorchFullyShardedDataParallel):
    """FSDP2 over the data-parallel group, on the adaptor's backend, following the FSDP2 YAML."""

    def __init__(self, config, ddp_config, module, sub_modules_to_wrap=None, disable_bucketing=False,
                 process_group=None, **unused):
        _BaseDataParallel.__init__(self, config=config, module=module)
        self.ddp_config = ddp_config
        self.fsdp2_config = getattr(ddp_config, "fsdp2_config", None) or _fallback_config(config, ddp_config)
        self.process_group = process_group or parallel_state.get_data_parallel_group(with_context_parallel=True)
        self.device_mesh = DeviceMesh.from_group(self.process_group, device_type(), mesh_dim_names=("dp",))
        self.sum_gradients = bool(config.calculate_per_token_loss)

        model = module.module if isinstance(module, Float16Module) else module
        for param in module.parameters():  # fp32 master weights (see the module docstring)
            if param.is_floating_point() and param.dtype != torch.float32:
                param.data = param.data.float()
        try:
            self.plan = sharding_plan(model, self.fsdp2_config)
        except Fsdp2ConfigError as exc:
            from adaptor.errors import fail

            fail(str(exc))
        attrs = {name: dict(vars(param), is_torch_fsdp2_param=True) for name, param in module.named_parameters()}

        for _, target in self.plan.recompute:
            checkpoint_forward(target)
        self._shard(module)
        for name, param in module.named_parameters():  # FSDP2 made new Parameters (pytorch#136929)
            for key, value in attrs.get(name, {}).items():
                setattr(param, key, value)
        self._prepare_ignored()
        if dist.get_rank() == 0:
            print(self.describe(), flush=True)

    def describe(self) -> str:
        """One line: what is sharded, ignored and recomputed, and how."""
        cfg, plan = self.fsdp2_config, self.plan
        return (f"[megatron-adaptor] fsdp2: mesh {self.device_mesh.device_type} x{self.device_mesh.size()}, "
                f"units [{_names(plan.units)}] + root, ignored [{_names(plan.ignored)}], "
                f"recomputed [{_names(plan.recompute)}], reshard_after_forward={cfg.reshard_after_forward}, "
                f"param_dtype={_dtype_name(cfg.param_dtype)}, reduce_dtype={_dtype_name(cfg.reduce_dtype)}, "
                f"offload_to_cpu={cfg.offload_to_cpu}, num_to_forward_prefetch={cfg.num_to_forward_prefetch}")

    # ------------------------------------------------------------------ sharding
    def _shard(self, root: torch.nn.Module) -> None:
        cfg = self.fsdp2_config
        offload = CPUOffloadPolicy(pin_memory=device_type() != "cpu") if cfg.offload_to_cpu else OffloadPolicy()
        kwargs = dict(
            mesh=self.device_mesh,
            reshard_after_forward=cfg.reshard_after_forward,
            mp_policy=MixedPrecisionPolicy(param_dtype=cfg.param_dtype, reduce_dtype=cfg.reduce_dtype,
                                           cast_forward_inputs=False),
            offload_policy=offload,
            ignored_params=set(self.plan.ignored_params) or None,
        )
        units = [unit for _, unit in self.plan.units]
        for unit in reversed(units):  # children before the units that contain them
            fully_shard(unit, **kwargs)
        fully_shard(root, **kwargs)
        for i, unit in enumerate(units):
            following = units[i + 1:i + 1 + cfg.num_to_forward_prefetch]
            if following:
                unit.set_modules_to_forward_prefetch(following)
            # Megatron's own rule: recomputation (--recompute-granularity) upsets FSDP2's
            # implicit backward order, so each unit prefetches the one before it.
            if self.config.recompute_granularity is not None and i > 0:
                unit.set_modules_to_backward_prefetch([units[i - 1]])
        if self.sum_gradients:
            for unit in units + [root]:
                unit.set_gradient_divide_factor(1.0)
                # A factor of 1 would otherwise be NCCL's PREMUL_SUM, which gloo lacks.
                unit.set_force_sum_reduction_for_comms(True)

    def _prepare_ignored(self) -> None:
        self._ignored_params = [p for p in self.plan.ignored_params if p.requires_grad]
        if dist.get_rank(self.process_group) != 0:
            for param in self._ignored_params:
                param.shared = True  # a replica: counted once, on the first data-parallel rank
        compute = self.fsdp2_config.param_dtype
        if compute != torch.float32:
            names = [name for name, _ in self.plan.ignored]
            for name, module in self.plan.ignored:
                if not any(name.startswith(outer + ".") for outer in names):
                    _compute_in_fp32(module, compute)

    # ------------------------------------------------------------------ gradients
    def finish_grad_sync(self, force_all_reduce=False):
        """Average (or sum, for per-token loss) the ignored modules' gradients over data-parallel ranks."""
        grads = [p.grad for p in self._ignored_params if p.grad is not None]
        size = dist.get_world_size(self.process_group)
        if not grads or size == 1:
            return
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.process_group)
        if not self.sum_gradients:
            flat.div_(size)
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(synced)

    def scale_gradients(self, scaling_factor) -> None:
        factors = {}  # one copy of a tensor factor per device, not per parameter
        for param in self.module.parameters():
            if param.grad is not None:
                grad = local(param.grad)
                if grad.device not in factors:
                    factors[grad.device] = (scaling_factor.to(grad.device) if isinstance(scaling_factor, torch.Tensor)
                                            else scaling_factor)
                grad.mul_(factors[grad.device])
