"""``--optimizer muon`` without the emerging-optimizers package.

Upstream: ``megatron.core.optimizer._get_megatron_emerging_optimizer`` builds Muon for the 2-D weight
matrices (``_EMERGING_OPTIMIZERS['muon']``: Megatron's ``TensorParallelMuon``) and
``--muon-scalar-optimizer`` (Adam) for embeddings, the output layer and every non-2-D parameter, but it
raises ImportError at once unless the emerging-optimizers package is installed, which it is not here.

The patch wraps that function: for ``optimizer == 'muon'`` it runs Megatron's own code (parameter
tagging, the Adam routing, the fp32/bf16 wrappers, the chained optimizer) with the registry's
``muon`` entry building :class:`adaptor.optimizers.muon.MegatronMuon` (Megatron's ``TensorParallelMuon``
step written out: every coefficient type, fp32 matmul precision and the per-block QKV split) and the
package check passed, both restored on return. Megatron tags the fused QKV weights (``is_qkv``,
``qkv_split_shapes``) inside the wrapped function, before the entry builds the optimizer. What does not
run here is refused before the run (``validate``); see :mod:`adaptor.optimizers.muon`.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature

OWNER = __name__
TARGET = "megatron.core.optimizer._get_megatron_emerging_optimizer"


def _entry():
    from megatron.core.optimizer.emerging_optimizers import EmergingOptimizerEntry, _is_nonlinear_or_embedding
    from megatron.core.optimizer.optimizer_config import ParamKey, ParamPredicate

    from adaptor.optimizers.muon import MegatronMuon, init_state, optimizer_kwargs

    return EmergingOptimizerEntry(
        optimizer_cls=MegatronMuon,
        init_state_fn=init_state,
        config_to_kwargs=lambda config, model_chunks, pg_collection: optimizer_kwargs(config),
        default_param_overrides={
            ParamKey(predicate=ParamPredicate(name="nonlinear_or_embedding", fn=_is_nonlinear_or_embedding)):
                {"optimizer": "adam"},
        },
    )


def _megatron_muon(wrapped, instance, call_args, kwargs):
    config = kwargs["config"] if "config" in kwargs else call_args[0]
    if config.optimizer != "muon":
        return wrapped(*call_args, **kwargs)
    import megatron.core.optimizer as optimizer_module
    from megatron.core.optimizer.emerging_optimizers import _EMERGING_OPTIMIZERS

    from adaptor.log import notice_once

    held_entry, held_flag = _EMERGING_OPTIMIZERS.get("muon"), optimizer_module.HAVE_EMERGING_OPTIMIZERS
    _EMERGING_OPTIMIZERS["muon"], optimizer_module.HAVE_EMERGING_OPTIMIZERS = _entry(), True
    try:
        optimizer = wrapped(*call_args, **kwargs)
    finally:
        _EMERGING_OPTIMIZERS["muon"], optimizer_module.HAVE_EMERGING_OPTIMIZERS = held_entry, held_flag
    notice_once("optimizer: Megatron's Muon (adaptor.optimizers.muon) for the 2-D weight matrices, "
                "Adam for the other parameters")
    if getattr(config, "use_layer_wise_distributed_optimizer", False):
        notice_once("optimizer: Megatron's layer-wise distributed optimizer: each data-parallel rank steps "
                    "its share of whole Muon matrices, then the ranks gather them")
    return optimizer


class MuonOptimizer(Feature):
    name = "muon"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(TARGET, _megatron_muon, OWNER)

    def validate(self, args, ctx) -> None:
        if args.optimizer not in ("muon", "dist_muon"):
            return
        from adaptor.optimizers.muon import unsupported

        why = unsupported(args)
        if why:
            raise ArgumentError(why)
