"""Megatron's layer-wise distributed optimizer (``--optimizer muon --use-distributed-optimizer``) in fp32.

Upstream: ``megatron.core.optimizer.layer_wise_optimizer.LayerWiseDistributedOptimizer.__init__``
wraps its shard of torch optimizers in ``Float16OptimizerWithFloat16Params`` under ``--bf16`` and
leaves them bare otherwise. A bare torch optimizer has no ``config`` (so the outer
``ChainedOptimizer`` that adds Adam's ``DistributedOptimizer`` fails its config assertion) and no
``prepare_grads``/``step_with_ready_grads`` (so the step could not run either). The wrapper gives each
bare optimizer the wrapper Megatron gives every other fp32 optimizer, ``FP32Optimizer``, after the
parameters were sharded, where the bf16 branch wraps. Its state is nested under ``'optimizer'``, the
layout ``LayerWiseDistributedOptimizer.sharded_state_dict`` reads (the bf16 wrapper's), so
``torch_dist`` checkpoints save and load.

Remove when: ``LayerWiseDistributedOptimizer.__init__`` wraps its optimizers in ``FP32Optimizer``
when neither bf16 nor fp16 is set. Not the case in megatron-core 0.19.2.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__
TARGET = "megatron.core.optimizer.layer_wise_optimizer.LayerWiseDistributedOptimizer.__init__"


def _fp32_wrapper(optimizer, config, init_state_fn):
    from megatron.core.optimizer.optimizer import FP32Optimizer

    class LayerWiseFP32Optimizer(FP32Optimizer):
        """FP32Optimizer whose sharded state sits under ``'optimizer'``, as the bf16 wrapper's does."""

        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict.get("optimizer", state_dict))

        def sharded_state_dict(self, model_sharded_state_dict, is_loading=False, metadata=None):
            return {"optimizer": super().sharded_state_dict(model_sharded_state_dict, is_loading, metadata)}

    return LayerWiseFP32Optimizer(optimizer, config, init_state_fn)


def _layer_wise_init(wrapped, instance, call_args, kwargs):
    wrapped(*call_args, **kwargs)
    names = ("optimizers", "config", "pg_collection", "init_state_fn_list", "model_chunks")
    given = {**dict(zip(names, call_args)), **kwargs}
    config, init_fns = given["config"], given.get("init_state_fn_list")
    if config.bf16 or config.fp16:
        return
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    instance.chained_optimizers = [
        opt if isinstance(opt, MegatronOptimizer) else _fp32_wrapper(opt, config, init_fns[i] if init_fns else None)
        for i, opt in enumerate(instance.chained_optimizers)
    ]
    instance.config = config


class LayerWiseOptimizerFp32(Feature):
    name = "layer_wise_optimizer_fp32"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(TARGET, _layer_wise_init, OWNER)
