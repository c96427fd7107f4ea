"""CLIP/SigLIP vision towers without Transformer Engine: their pre/post norms.

Upstream: ``megatron.core.models.vision.clip_vit_model.CLIPViTModel.__init__`` defaults
``ln_pre_impl``/``ln_post_impl`` to ``NORM_IMPL``, which without TE is ``torch.nn.LayerNorm``, and
builds it with ``config=...``, which LayerNorm does not take: every CLIP/SigLIP tower, and so
``LLaVAModel``, fails ("got an unexpected keyword argument 'config'"). For a norm the caller did not
choose, and only while the default is the bare torch class, the wrapper passes megatron-core's
``WrappedTorchNorm`` (same parameter names); with TE ``TENorm`` stays. Enabled on every backend.

Remove when: ``clip_vit_model.NORM_IMPL`` (the default of ``ln_pre_impl``/``ln_post_impl``) falls
back, without Transformer Engine, to a norm that takes ``config=`` such as ``WrappedTorchNorm``. Not
fixed upstream as of megatron-core 0.19.2 nor on Megatron-LM main (d98e8a64, 2026-08-22), where it
is still ``torch.nn.LayerNorm``; no upstream issue or PR found.
"""
from __future__ import annotations

import torch

from adaptor.features import Feature

OWNER = __name__


def _clip_vit_init(wrapped, instance, call_args, kwargs):
    from megatron.core.models.vision import clip_vit_model
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if clip_vit_model.NORM_IMPL is torch.nn.LayerNorm:
        # Positional order upstream: (config, layer_spec, ln_pre_impl, ln_post_impl, ...).
        if len(call_args) < 3:
            kwargs.setdefault("ln_pre_impl", WrappedTorchNorm)
        if len(call_args) < 4:
            kwargs.setdefault("ln_post_impl", WrappedTorchNorm)
    return wrapped(*call_args, **kwargs)


class VisionTowerNorms(Feature):
    name = "vision_tower_norms"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.core.models.vision.clip_vit_model.CLIPViTModel.__init__",
                            _clip_vit_init, OWNER)
