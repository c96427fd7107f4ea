"""``--optimizer-cpu-offload [--optimizer-offload-fraction F]``: Adam state in host memory, on every backend.

Upstream, the flag builds ``HybridDeviceOptimizer``, which needs ``--use-precision-aware-optimizer``
(Transformer Engine's FusedAdam) and tells host from device tensors with ``is_cuda``. Here the flag is
taken over before Megatron validates (``args.optimizer_cpu_offload`` is turned off, so Megatron builds
its usual optimizer), and two patches put the offload in:

* ``megatron.core.optimizer._get_megatron_optimizer_based_on_param_groups`` (wrapped): the inner
  ``torch.optim`` optimizer of the FP32 / Float16 / Distributed wrapper it returns is replaced by
  ``adaptor.memory.optimizer_offload.HostOffloadAdam`` over the same parameter groups (the wrapper's
  fp32 main parameters), with the config's hyper-parameters: the first F of the elements keep their
  fp32 master copy and Adam moments on the host and are stepped there; gradient clipping, loss
  scaling and the checkpoint code of the wrapper run unchanged on torch's state layout. The groups
  keep what inner wrappers set on them (``patches.fusions.fused_adam``'s fused kernel: both parts use it).
* ``megatron.training.checkpointing.load_checkpoint`` (wrapped): a load writes the device copies of
  the parameters, so the host master copies are re-read from them before the next step.
"""
from __future__ import annotations

import sys

from adaptor.features import ArgumentError, Feature

OWNER = __name__
BUILD = "megatron.core.optimizer._get_megatron_optimizer_based_on_param_groups"
LOAD = "megatron.training.checkpointing.load_checkpoint"
# Megatron's knobs of its own offload; they mean something only with --optimizer-cpu-offload.
TUNING = {"optimizer_offload_fraction": "--optimizer-offload-fraction",
          "overlap_cpu_optimizer_d2h_h2d": "--overlap-cpu-optimizer-d2h-h2d",
          "use_torch_optimizer_for_cpu_offload": "--use-torch-optimizer-for-cpu-offload",
          "pin_cpu_grads": "--no-pin-cpu-grads", "pin_cpu_params": "--no-pin-cpu-params"}


def _offload_inner_optimizer(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    from adaptor import run_state
    from adaptor.log import notice_once
    from adaptor.memory.optimizer_offload import HostOffloadAdam

    result = wrapped(*call_args, **kwargs)
    inner = getattr(result, "optimizer", None)
    if isinstance(result, tuple) or inner is None:
        return result
    run, config = get_args(), result.config
    result.optimizer = HostOffloadAdam(
        inner.param_groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
        weight_decay=config.weight_decay, decoupled_weight_decay=config.decoupled_weight_decay,
        fraction=run.host_optimizer_offload_fraction, device_type=run_state.backend().name,
        pin_grads=config.pin_cpu_grads, pin_params=config.pin_cpu_params,
        overlap=config.overlap_cpu_optimizer_d2h_h2d)
    total = sum(p.numel() for g in inner.param_groups for p in g["params"])
    result.optimizer.after_first_step = lambda host: notice_once(
        f"optimizer offload: the first step updated {host} of rank 0's {total} optimizer elements in host memory",
        key=f"{OWNER}:{total}")
    return result


def _load_checkpoint(wrapped, instance, call_args, kwargs):
    from adaptor.memory.optimizer_offload import mark_all_stale

    try:
        return wrapped(*call_args, **kwargs)
    finally:
        mark_all_stale()


class OptimizerOffload(Feature):
    name = "optimizer_offload"
    upstream_flags = ("--optimizer-cpu-offload",)

    def enabled(self, ctx) -> bool:
        # also on for the tuning flags alone, so that validate() can say they need the switch
        argv = ctx.argv if ctx.argv is not None else sys.argv[1:]
        given = {a.split("=", 1)[0] for a in argv}
        return super().enabled(ctx) and bool(given & ({"--optimizer-cpu-offload"} | set(TUNING.values())))

    def register_patches(self, pm, ctx) -> None:
        if not getattr(ctx.flags, "optimizer_cpu_offload", False):
            return
        pm.register_wrapper(BUILD, _offload_inner_optimizer, OWNER)
        pm.register_wrapper(LOAD, _load_checkpoint, OWNER)

    def validate(self, args, ctx) -> None:
        from adaptor.log import notice_once

        fraction = args.optimizer_offload_fraction
        if not 0.0 <= fraction <= 1.0:
            raise ArgumentError(f"--optimizer-offload-fraction is a fraction of the parameters' elements: "
                                f"give a value in [0, 1], not {fraction}")
        if not args.optimizer_cpu_offload:
            if getattr(args, "host_optimizer_offload_fraction", None) is not None:
                return  # arguments parsed a second time, after this check turned the switch off
            given = [flag for dest, flag in TUNING.items() if dest in ctx.explicit]
            if given:
                raise ArgumentError(f"{given[0]} tunes --optimizer-cpu-offload; add --optimizer-cpu-offload "
                                    f"or drop {given[0]}")
            return
        if args.optimizer != "adam":
            raise ArgumentError(f"--optimizer-cpu-offload steps Adam in host memory; --optimizer {args.optimizer} "
                                f"is not offloaded, so use --optimizer adam or drop the offload")
        if getattr(args, "use_precision_aware_optimizer", False):
            raise ArgumentError("--optimizer-cpu-offload keeps fp32 Adam state in host memory with torch's Adam; "
                                "drop --use-precision-aware-optimizer")
        if getattr(args, "use_torch_fsdp2", False) or getattr(args, "use_megatron_fsdp", False):
            raise ArgumentError("--optimizer-cpu-offload offloads Megatron's optimizer wrappers' main parameters; "
                                "FSDP's sharded DTensor parameters are not offloaded, so drop one of the two")
        # Megatron's own path (HybridDeviceOptimizer) stays off; ours reads this instead.
        args.optimizer_cpu_offload = False
        args.host_optimizer_offload_fraction = fraction
        notice_once(f"--optimizer-cpu-offload: the fp32 master copies and Adam moments of {fraction:.0%} of the "
                    f"optimizer's elements live in host memory and are stepped there by torch's Adam; the rest "
                    f"stays on the device")
        if ctx.backend.name == "cpu":
            notice_once("--optimizer-cpu-offload saves no memory on the cpu backend: the device is host memory "
                        "(the host copies and host step still run, as separate tensors)")
