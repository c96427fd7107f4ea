"""What pretrain_mm.py runs for each model.json ``model_id``: model, initial weights, forward step, dataset.

Each entry's functions take what Megatron hands the entry file (arguments, model.json, TransformerConfig,
data iterator), so pretrain_mm.py stays the same for every model.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class MMBuilder:
    build_model: str  # (args, model_cfg, config, pre_process, post_process, vp_stage, pg_collection) -> model
    load_weights: str  # (model, model_cfg, args): the initial weights model.json names
    forward_step: str  # Megatron's forward_step_func
    train_dataset: str  # (args, data_cfg, model_cfg, num_samples) -> the training dataset

    def __getattribute__(self, name):
        """Fields are ``module:function`` names, imported when first used (the families import what they need)."""
        target = object.__getattribute__(self, name)
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


LLAVA = MMBuilder("adaptor.mm.model:build_llava_model", "adaptor.mm.weights:load_initial_weights",
                  "adaptor.mm.llava_steps:forward_step", "adaptor.mm.llava_steps:train_dataset")
QWEN_VL = MMBuilder("adaptor.mm.qwen_vl.model:build_qwen_vl_model", "adaptor.mm.qwen_vl.steps:load_initial_weights",
                    "adaptor.mm.qwen_vl.steps:forward_step", "adaptor.mm.qwen_vl.steps:train_dataset")
BUILDERS = {"llava": LLAVA, "qwen2_5vl": QWEN_VL, "qwen3vl": QWEN_VL, "qwen3_vl": QWEN_VL}


def builder(model_cfg) -> MMBuilder:
    return BUILDERS[model_cfg.model_id]
