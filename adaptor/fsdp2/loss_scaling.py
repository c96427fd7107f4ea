"""``--fp16`` under FSDP2: Megatron's loss scaling for fp32 sharded master parameters.

FSDP2 keeps the parameters as fp32 shards (the masters), gathers them in fp16 for compute and
reduce-scatters the gradients into fp32 shards, so Megatron's ``FP32Optimizer`` steps them as it
does under ``--bf16``. What fp16 adds is the loss scale: :class:`LossScaledFP32Optimizer` is that
optimizer with the grad scaler of Megatron's ``MixedPrecisionOptimizer`` (the same
``DynamicGradScaler``/``ConstantGradScaler``, built from the same options by
:func:`grad_scaler_from_config` as ``get_megatron_optimizer`` builds it):

* the loss is multiplied by :meth:`get_loss_scale` (Megatron's ``scale_loss``);
* before clipping, every local gradient shard is unscaled and checked for inf/NaN; the flag is
  reduced (max) over every rank, since each rank holds different shards; a step with an
  overflow anywhere is skipped everywhere and the scaler updated, as in
  ``MixedPrecisionOptimizer.prepare_grads``;
* the scaler state travels with the optimizer state under ``grad_scaler``, as in
  ``Float16OptimizerWithFloat16Params.state_dict``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler, MegatronGradScaler
from megatron.core.optimizer.optimizer import FP32Optimizer

GRAD_SCALER = "grad_scaler"


def grad_scaler_from_config(config) -> MegatronGradScaler:
    """The scaler ``get_megatron_optimizer`` gives an ``--fp16`` optimizer (megatron-core 0.19.2)."""
    if config.loss_scale:
        return ConstantGradScaler(config.loss_scale)
    return DynamicGradScaler(initial_scale=config.initial_loss_scale, min_scale=config.min_loss_scale,
                             growth_factor=2.0, backoff_factor=0.5, growth_interval=config.loss_scale_window,
                             hysteresis=config.hysteresis)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


class LossScaledFP32Optimizer(FP32Optimizer):
    """Megatron's ``FP32Optimizer`` over fp32 sharded masters, with fp16's loss scaling."""

    def __init__(self, optimizer, config, init_state_fn, grad_scaler: MegatronGradScaler, found_inf_group=None):
        super().__init__(optimizer, config, init_state_fn)
        self.grad_scaler = grad_scaler
        self.found_inf_group = found_inf_group  # None: every rank (each holds different shards)
        self.found_inf = torch.zeros(1, dtype=torch.float, device=grad_scaler.scale.device)

    @classmethod
    def from_fp32(cls, fp32: FP32Optimizer, grad_scaler: MegatronGradScaler) -> "LossScaledFP32Optimizer":
        """The same optimizer (and the attributes Megatron set on it after building it), loss-scaled."""
        scaled = cls(fp32.optimizer, fp32.config, fp32.init_state_fn, grad_scaler)
        for key, value in vars(fp32).items():
            if key not in vars(scaled):
                setattr(scaled, key, value)
        return scaled

    def get_loss_scale(self):
        return self.grad_scaler.scale

    def _local_grads(self) -> list[torch.Tensor]:
        if self.is_stub_optimizer:
            return []
        return [_local(param.grad) for group in self.optimizer.param_groups for param in group["params"]
                if param.grad is not None]

    @torch.no_grad()
    def unscale_and_check_for_nan(self) -> bool:
        """Unscale this rank's gradient shards; True when any rank found an inf or NaN."""
        self.found_inf.fill_(0.0)
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for grad in self._local_grads():  # offloaded shards live on the host
            by_device.setdefault(grad.device, []).append(grad)
        for device, grads in by_device.items():
            found = self.found_inf if device == self.found_inf.device else torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, self.grad_scaler.inv_scale.to(device))
            if found is not self.found_inf:
                self.found_inf.copy_(torch.maximum(self.found_inf, found.to(self.found_inf.device)))
        if dist.is_initialized():
            dist.all_reduce(self.found_inf, op=dist.ReduceOp.MAX, group=self.found_inf_group)
        return self.found_inf.item() > 0

    @torch.no_grad()
    def prepare_grads(self) -> bool:
        """``FP32Optimizer.prepare_grads``, then ``MixedPrecisionOptimizer``'s unscale, check and scaler update."""
        super().prepare_grads()
        timers = self.config.timers
        if timers is not None:
            timers("optimizer-unscale-and-check-inf", log_level=1).start(barrier=self.config.barrier_with_L1_time)
        found_inf = self.unscale_and_check_for_nan()
        if timers is not None:
            timers("optimizer-unscale-and-check-inf").stop()
        self.grad_scaler.update(found_inf)
        return found_inf

    def state_dict(self, *args, **kwargs):
        state_dict = super().state_dict(*args, **kwargs)
        state_dict[GRAD_SCALER] = self.grad_scaler.state_dict()
        return state_dict

    def load_grad_scaler(self, state) -> None:
        """Restore the scaler from a saved ``grad_scaler`` entry, on this scaler's device."""
        if not isinstance(self.grad_scaler, DynamicGradScaler) or not state or "scale" not in state:
            return  # a constant scale comes from --loss-scale, as in Megatron
        self.grad_scaler._scale = torch.as_tensor(state["scale"], dtype=torch.float).to(
            self.grad_scaler.scale.device).clone()
        self.grad_scaler._growth_tracker = int(state["growth_tracker"])
        self.grad_scaler._hysteresis_tracker = int(state["hysteresis_tracker"])

    def load_state_dict(self, state_dict):
        scaler_state = state_dict.pop(GRAD_SCALER, None)
        super().load_state_dict(state_dict)
        if scaler_state is not None:
            self.load_grad_scaler(scaler_state)
