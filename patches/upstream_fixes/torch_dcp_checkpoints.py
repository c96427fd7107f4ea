"""``--ckpt-format torch_dcp`` (Megatron's format for its torch FSDP2 path): the two calls upstream gets wrong.

Upstream, ``megatron.training.checkpointing``:

* ``load_checkpoint`` builds the state dict that torch.distributed.checkpoint fills in place with
  ``optimizer.state_dict(is_loading=True)``. Only ``Float16OptimizerWithFloat16Params.state_dict``
  takes ``is_loading``; the ``ChainedOptimizer`` that ``get_megatron_optimizer`` returns and the
  ``FP32Optimizer`` inside it do not, so every torch_dcp resume ended in "state_dict() got an
  unexpected keyword argument 'is_loading'". Both now take it. Loading also needs the optimizer
  state to exist before the first step, or there is nothing to read into: ``is_loading`` runs the
  optimizer's ``init_state_fn`` (the moments) and, for torch's Adam/AdamW, whose step count is
  per parameter and left out by ``init_state_fn``, adds a ``step`` to fill.
* ``save_checkpoint`` with ``--async-save`` plans the save with the ``save_state_dict_async_plan``
  of ``get_async_strategy(args.async_strategy)``, calling it as nvidia-resiliency-ext's version
  (an ``enable_cache`` argument, the finalize arguments returned alone). Megatron's own
  (``--async-strategy mcore``, ``strategies.state_dict_saver.save_state_dict_async_plan``) takes
  no ``enable_cache`` and returns the finalize arguments with its plan cache: "unexpected keyword
  argument 'enable_cache'". Called that way (nothing else passes ``enable_cache``), it now drops
  the argument (each save plans anew, as without ``--ckpt-assume-constant-structure``) and returns
  the finalize arguments alone.

Remove when: for the first bullet, ``ChainedOptimizer.state_dict`` and ``FP32Optimizer.state_dict``
accept ``is_loading`` and initialise the state they return (torch Adam's ``step`` included); for
the second, ``save_checkpoint``'s torch_dcp branch calls Megatron's ``save_state_dict_async_plan``
by its own signature. Neither is fixed in megatron-core 0.19.2 nor on Megatron-LM main (d98e8a64,
2026-08-22: ``load_checkpoint`` still passes ``is_loading=True``, ``save_checkpoint`` still passes
``enable_cache``); no upstream issue or PR found.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__
OPTIMIZERS = "megatron.core.optimizer.optimizer"


def _initialise_state(megatron_optimizer) -> None:
    """Create the state a step would create, so that a checkpoint load has tensors to fill."""
    import torch

    inner = getattr(megatron_optimizer, "optimizer", None)
    init = getattr(megatron_optimizer, "init_state_fn", None)
    if inner is None or init is None:
        return
    init(inner, getattr(megatron_optimizer, "config", None))
    if not isinstance(inner, torch.optim.Adam):  # AdamW is a subclass
        return
    from torch.optim.optimizer import _get_scalar_dtype

    for group in inner.param_groups:
        fused = bool(group.get("fused"))
        on_device = fused or group.get("capturable")
        for param in group["params"]:
            state = inner.state[param]
            if state and "step" not in state:
                state["step"] = torch.zeros((), dtype=_get_scalar_dtype(is_fused=fused),
                                            device=param.device if on_device else "cpu")


def _state_dict(wrapped, instance, call_args, kwargs):
    is_loading = kwargs.pop("is_loading", call_args[0] if call_args else False)
    if is_loading:
        for optimizer in getattr(instance, "chained_optimizers", [instance]):
            _initialise_state(optimizer)
    return wrapped()


def _save_state_dict_async_plan(wrapped, instance, call_args, kwargs):
    if "enable_cache" not in kwargs:
        return wrapped(*call_args, **kwargs)  # called by its own signature (torch_dist's strategy)
    kwargs.pop("enable_cache")
    finalize_args, *_plan_cache = wrapped(*call_args, **kwargs)
    return finalize_args


class TorchDcpCheckpoints(Feature):
    name = "torch_dcp_checkpoints"

    def register_patches(self, pm, ctx) -> None:
        # Only Megatron's torch_dcp load passes is_loading; every other call runs unchanged.
        for cls in ("ChainedOptimizer", "FP32Optimizer"):
            pm.register_wrapper(f"{OPTIMIZERS}.{cls}.state_dict", _state_dict, OWNER)
        # Only save_checkpoint's torch_dcp branch passes enable_cache, which this function does not take.
        pm.register_wrapper("megatron.core.dist_checkpointing.strategies.state_dict_saver.save_state_dict_async_plan",
                            _save_state_dict_async_plan, OWNER)
