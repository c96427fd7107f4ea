"""CLIP/SigLIP vision towers without Transformer Engine: their pre/post norms.

Upstream: ``megatron.core.models.vision.clip_vit_model.CLIPViTModel.__init__`` takes
``ln_pre_impl``/``ln_post_impl`` defaulting to the module constant ``NORM_IMPL``, which is TE's
``TENorm`` when Transformer Engine imports and ``torch.nn.LayerNorm`` otherwise. It builds them
through ``build_module(impl, config=..., hidden_size=..., eps=...)``, a signature
``torch.nn.LayerNorm`` does not take, so without TE every CLIP (``ln_pre``) and SigLIP
(``ln_post``) tower — and so ``LLaVAModel`` — fails with "LayerNorm.__init__() got an
unexpected keyword argument 'config'". ``LLaVAModel`` passes no norm of its own.

The wrapper supplies megatron-core's ``WrappedTorchNorm`` (the norm of the local layer specs,
which takes that signature and builds ``torch.nn.LayerNorm`` from ``config.normalization``) for
a norm the caller did not choose, and only while the default is the bare torch class: with TE
installed ``TENorm`` stays. Parameter names (``ln_pre.weight``/``bias``) are the same either way.
Enabled on every backend, for any script that builds the tower (pretrain_mm.py,
tools/check_vision_parity.py, a user's own).

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
