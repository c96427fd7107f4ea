"""megatron-core's LLaVAModel, built from model.json and Megatron's arguments.

Its parts are megatron-core's modules: ``vision_model`` a ``CLIPViTModel`` (``clip`` or ``siglip``
variant, local or TE ViT spec), ``vision_projection`` a ``MultimodalProjector`` (``mlp`` or
``affine``), ``language_model`` a ``GPTModel`` with :func:`adaptor.layer_specs.gpt_layer_spec`,
configured by the arguments model.json's ``text_decoder`` filled (patches/multimodal/mm_arguments.py).
Freezing uses ``LLaVAModel.freeze`` before Megatron wraps the model, so frozen parts get no gradient
buffers or optimizer state. Sharding wrappers can leave the tower out by its class,
``megatron.core.models.vision.clip_vit_model.CLIPViTModel``, or its name ``vision_model``.
"""
from __future__ import annotations

import dataclasses
from functools import partial

import torch

from adaptor.mm.data import IMAGE_TOKEN_INDEX

ACTIVATIONS = {
    "quick_gelu": "megatron.core.activations:quick_gelu",
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": partial(torch.nn.functional.gelu, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


def activation(name: str):
    fn = ACTIVATIONS[name]
    if isinstance(fn, str):
        import importlib

        module, _, attr = fn.partition(":")
        return getattr(importlib.import_module(module), attr)
    return fn


def vision_transformer_config(base, vision: dict):
    """The text decoder's TransformerConfig (precision, parallel sizes, init) with the tower's shape."""
    config = dataclasses.replace(
        base,
        num_layers=vision["num_layers"], hidden_size=vision["hidden_size"],
        ffn_hidden_size=vision["ffn_hidden_size"], num_attention_heads=vision["num_attention_heads"],
        num_query_groups=None, kv_channels=None, qk_layernorm=False, normalization="LayerNorm",
        layernorm_epsilon=vision["layernorm_epsilon"], gated_linear_unit=False,
        activation_func=activation(vision["activation_func"]), bias_activation_fusion=False,
        add_bias_linear=True, add_qkv_bias=True, hidden_dropout=vision["hidden_dropout"],
        attention_dropout=vision["attention_dropout"], apply_rope_fusion=False,
        init_method=None, output_layer_init_method=None,
    )
    config.vision_model_type = vision["model_id"]  # read by LLaVAModel (not a dataclass field)
    return config


def projector_config(base, projector: dict, text_hidden: int):
    return dataclasses.replace(
        base, num_layers=1, hidden_size=text_hidden, ffn_hidden_size=projector["ffn_hidden_size"] or text_hidden,
        gated_linear_unit=False, activation_func=activation(projector["activation_func"]),
        bias_activation_fusion=False, add_bias_linear=projector["add_bias_linear"],
        init_method=None, output_layer_init_method=None,
    )


def vision_layer_spec(args):
    from megatron.core.models.vision import vit_layer_specs

    from adaptor.layer_specs import module_swaps, swap_modules

    if args.transformer_impl == "transformer_engine":
        return vit_layer_specs.get_vit_layer_with_transformer_engine_spec()
    return swap_modules(vit_layer_specs.get_vit_layer_with_local_spec(), module_swaps(args))


def projector_submodules(args):
    from megatron.core.transformer.mlp import MLPSubmodules

    if args.transformer_impl == "transformer_engine":
        from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TERowParallelLinear

        return MLPSubmodules(linear_fc1=TEColumnParallelLinear, linear_fc2=TERowParallelLinear)
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    return MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)


def build_vision_tower(args, vision: dict, config=None):
    """The vision tower alone, as LLaVAModel builds it (tools/check_vision_parity.py)."""
    from megatron.core.models.vision.clip_vit_model import CLIPViTModel
    from megatron.training.arguments import core_transformer_config_from_args

    config = vision_transformer_config(config or core_transformer_config_from_args(args), vision)
    clip = vision["model_id"] == "clip"
    return CLIPViTModel(config, vision_layer_spec(args), add_class_token=clip, class_token_len=1 if clip else 0,
                        patch_dim=vision["patch_size"], img_h=vision["image_size"], img_w=vision["image_size"],
                        model_subtype=vision["model_id"])


def build_llava_model(args, model_cfg, config, pre_process=True, post_process=True, vp_stage=None,
                      pg_collection=None):
    from megatron.core.models.multimodal.llava_model import LLaVAModel

    from adaptor.layer_specs import gpt_layer_spec

    vision, projector, text = model_cfg.vision, model_cfg.projector, model_cfg.text
    model = LLaVAModel(
        language_transformer_config=config,
        language_transformer_layer_spec=gpt_layer_spec(args, config, vp_stage=vp_stage),
        language_vocab_size=args.padded_vocab_size,
        language_max_sequence_length=args.max_position_embeddings,
        vision_transformer_config=vision_transformer_config(config, vision),
        vision_transformer_layer_spec=vision_layer_spec(args),
        drop_vision_class_token=vision["drop_class_token"],
        vision_projection_config=projector_config(config, projector, args.hidden_size),
        vision_projection_layer_spec=projector_submodules(args),
        vision_projection_type=projector["model_id"],
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        language_position_embedding_type=args.position_embedding_type,
        language_rotary_percent=args.rotary_percent,
        language_rotary_base=args.rotary_base,
        language_rope_scaling=args.use_rope_scaling,
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        pre_process=pre_process, post_process=post_process,
        add_encoder=pre_process, add_decoder=True,
        img_h=vision["image_size"], img_w=vision["image_size"], patch_dim=vision["patch_size"],
        image_token_index=IMAGE_TOKEN_INDEX,
        pg_collection=pg_collection, vp_stage=vp_stage,
    )
    model.freeze(freeze_language_model=text["freeze"], freeze_vision_model=vision["freeze"],
                 freeze_vision_projection=projector["freeze"])
    return model
