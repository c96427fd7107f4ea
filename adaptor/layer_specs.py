"""Layer specs for GPTModel, chosen per backend and feature in one place.

``--transformer-impl transformer_engine`` (CUDA with TE) takes megatron-core's TE spec unchanged;
otherwise its local spec of plain torch modules (backend defaults pick ``local`` when TE cannot run,
so flags are the same everywhere). Then each feature's ``module_swaps`` row (:mod:`adaptor.features`)
replaces an upstream class with ours wherever it occurs, when its gate is on (:func:`row_is_on`);
where two rows replace one class the later feature in the registry wins (MLA + ``--use-flash-attn``:
flash attention).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any, Mapping

from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.tensor_parallel.layers import ColumnParallelLinear
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from adaptor.batch_format import batch_format
from adaptor.wrapping import overridden


def _load(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def swap_rows(features=None) -> list[tuple[str, str, str]]:
    """The features' declared swaps (``Feature.module_swaps``), in registry order.

    By default every feature of this run's registry: a row is gated by the run's argument, which
    is the truth when the spec is built (a default or a config file may set it after the
    command line chose the features).
    """
    if features is None:
        from adaptor import run_state

        features = run_state.registry() or ()  # a library user without a run: the upstream modules
    return [row for feature in features for row in feature.module_swaps]


# Gates named ``source.field`` read a decision made from the arguments rather than one argument.
_GATE_SOURCES = {"batch_format": batch_format}


def row_is_on(args, gate: str) -> bool:
    """A row's gate: an argument that is on (``use_flash_attn``) or above a size (``context_parallel_size>1``),
    or a field of the run's batch format (``batch_format.thd``: attention takes THD), a decision of several
    arguments that :func:`adaptor.batch_format.batch_format` alone makes."""
    name, _, threshold = gate.partition(">")
    source, _, field = name.rpartition(".")
    holder = _GATE_SOURCES[source](args) if source else args
    value = getattr(holder, field, None)
    return bool(value) if not threshold else (value or 0) > int(threshold)


def module_swaps(args, features=None) -> dict:
    """Upstream class -> our class, for the rows whose gate is on (later rows win)."""
    return {_load(old): _load(new) for gate, old, new in swap_rows(features) if row_is_on(args, gate)}


def swap_modules(spec: Any, swaps: Mapping[type, type]) -> Any:
    """A copy of ``spec`` with every class in ``swaps`` replaced, however deeply nested.

    Walks ModuleSpecs, submodule dataclasses, ``functools.partial`` builders
    and lists; leaves everything else as it is. The input is not modified.
    """
    if not swaps:
        return spec
    if isinstance(spec, type):
        return swaps.get(spec, spec)
    if isinstance(spec, ModuleSpec):
        return dataclasses.replace(
            spec, module=swap_modules(spec.module, swaps), submodules=swap_modules(spec.submodules, swaps)
        )
    if isinstance(spec, functools.partial):
        return functools.partial(
            swap_modules(spec.func, swaps),
            *[swap_modules(a, swaps) for a in spec.args],
            **{k: swap_modules(v, swaps) for k, v in spec.keywords.items()},
        )
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        changes = {f.name: swap_modules(getattr(spec, f.name), swaps) for f in dataclasses.fields(spec) if f.init}
        return dataclasses.replace(spec, **changes)
    if isinstance(spec, (list, tuple)):
        return type(spec)(swap_modules(s, swaps) for s in spec)
    return spec


class _LocalGatedDeltaNetBackend(LocalSpecProvider):
    """megatron-core's local provider, with the plain ``ColumnParallelLinear`` as GDN's ``in_proj``.

    Transformer Engine fuses the layer's input norm into ``in_proj`` (``TELayerNormColumnParallelLinear``,
    ``layer_norm_weight`` inside ``in_proj``); the local provider has no such module. We keep the norm
    where every local-spec layer keeps it, as the layer's own ``input_layernorm`` (so the same swaps
    apply to it: ``--use-fused-rmsnorm``, ``--apply-layernorm-1p``, recompute of norms), and the GDN
    input projection is the plain column-parallel linear: the same function, and the state-dict names
    the local spec's attention layers already use (``input_layernorm.weight``, as ``linear_qkv`` has).
    """

    def column_parallel_layer_norm_linear(self) -> type:
        return ColumnParallelLinear


def _gated_delta_net_block_spec(args, config: TransformerConfig, vp_stage=None):
    """The local block of ``--experimental-attention-variant gated_delta_net``: megatron-core's layer pattern
    (``get_linear_attention_pattern``: GDN layers, every ``--linear-attention-freq``-th standard attention;
    ``get_moe_layer_pattern`` for the MLPs), built from the local spec's layers with GDN put in place of
    self-attention where the pattern says, then sliced for this pipeline stage as upstream slices it."""
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_gated_delta_net_module_spec,
        get_linear_attention_pattern,
    )
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    with overridden(config, experimental_attention_variant=None):  # upstream's standard builder asserts it is unset
        layers = get_gpt_decoder_layer_specs(config, use_transformer_engine=False, normalization=args.normalization)
        block = get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization=args.normalization, vp_stage=vp_stage)
    gdn = get_gated_delta_net_module_spec(config, backend=_LocalGatedDeltaNetBackend())
    gdn = dataclasses.replace(gdn, metainfo={**gdn.metainfo, "fuse_input_layernorm": False})
    pattern = get_linear_attention_pattern(config)
    layers = [
        dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules, self_attention=gdn))
        if linear else layer
        for layer, linear in zip(layers, pattern)
    ]
    if config.pipeline_model_parallel_layout is not None:
        local_ids = config.pipeline_model_parallel_layout.get_layer_id_list(
            layer_type=LayerType.decoder, vp_stage=vp_stage)
    else:
        offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
        local_ids = range(offset, offset + get_num_layers_to_build(config, vp_stage=vp_stage))
    return dataclasses.replace(block, layer_specs=[layers[i] for i in local_ids])


def gpt_layer_spec(args, config: TransformerConfig, vp_stage=None):
    """Spec for one decoder layer, or a block spec when MoE layers vary per layer (or GDN layers)."""
    use_te = args.transformer_impl == "transformer_engine"
    if getattr(args, "experimental_attention_variant", None) == "gated_delta_net":
        if use_te:
            from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
                get_transformer_block_with_experimental_attention_variant_spec,
            )

            return get_transformer_block_with_experimental_attention_variant_spec(config, vp_stage=vp_stage)
        spec = _gated_delta_net_block_spec(args, config, vp_stage=vp_stage)
    elif args.num_experts:
        spec = get_gpt_decoder_block_spec(
            config, use_transformer_engine=use_te, normalization=args.normalization, vp_stage=vp_stage
        )
    elif use_te:
        spec = get_gpt_layer_with_transformer_engine_spec(
            args.num_experts, args.moe_grouped_gemm, args.qk_layernorm,
            args.multi_latent_attention,
        )
    else:
        spec = get_gpt_layer_local_spec(
            args.num_experts, args.moe_grouped_gemm, args.qk_layernorm,
            args.multi_latent_attention, normalization=args.normalization,
        )
    return spec if use_te else swap_modules(spec, module_swaps(args))


def gpt_mtp_block_spec(args, config: TransformerConfig, layer_spec, vp_stage=None):
    """Spec of the multi-token-prediction block (``--mtp-num-layers``), or None on stages without it.

    As Megatron-LM's pretrain_gpt: each MTP layer wraps a copy of the last decoder layer
    (the MoE layer for DeepSeek-V3). We take the model's last layer rather than this stage's
    last, which is the same layer whenever the stage holds any, and defined when it holds none.
    """
    if not args.mtp_num_layers:
        return None
    use_te = args.transformer_impl == "transformer_engine"
    if args.num_experts:
        # With GDN too the MTP layer is a standard-attention layer (Qwen3-Next's MTP layer attends fully).
        with overridden(config, experimental_attention_variant=None):
            layer_spec = get_gpt_decoder_layer_specs(
                config, use_transformer_engine=use_te, normalization=args.normalization
            )[-1]
    spec = get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=use_te, vp_stage=vp_stage)
    return spec if use_te or spec is None else swap_modules(spec, module_swaps(args))
