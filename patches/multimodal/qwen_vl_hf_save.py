"""``pretrain_mm.py --hf-save-dir DIR`` for Qwen2.5-VL / Qwen3-VL: the model as a Hugging Face directory.

Wraps ``megatron.training.training.train`` as ``--hf-save-dir`` does for GPT models
(patches/hf/online_conversion.py): after the last iteration every rank hands its state over and rank 0
writes ``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` tensors
(:func:`adaptor.mm.qwen_vl.hf_export.save_vl_hf_dir`), all or nothing.

Enabled for ``--mm-model`` runs that name ``--hf-load-dir`` or ``--hf-save-dir`` (the GPT feature steps
aside for them). ``--hf-load-dir DIR`` is read where model.json's ``init_from_hf_path`` would be
(:func:`adaptor.mm.config.run_model_config`): DIR's config.json describes the model, checked against the
shape keys model.json gives, and its tensors start the run unless ``--load`` holds a checkpoint
(:func:`adaptor.mm.qwen_vl.steps.hf_weights_to_load`). Here, one line each: both naming different
directories (raised while model.json is read), ``--pretrained-checkpoint`` beside it, a directory without
weights, and a llava model.json, whose tower and decoder come from two directories.
"""
from __future__ import annotations

from pathlib import Path

from adaptor.features import ArgumentError, Feature

OWNER = __name__


def train_then_save(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    from adaptor.mm.config import run_model_config
    from adaptor.mm.qwen_vl.hf_export import save_vl_hf_dir

    result = wrapped(*call_args, **kwargs)
    args = get_args()
    if args.hf_save_dir is not None:
        model = call_args[1] if len(call_args) > 1 else kwargs["model"]
        save_vl_hf_dir(model, args, result[0], run_model_config(args))
    return result


def check_hf_flags(args, model_cfg) -> None:
    """One line for what a multimodal run cannot do with ``--hf-load-dir`` / ``--hf-save-dir``."""
    qwen_vl = model_cfg.hf_config is not None
    load = getattr(args, "hf_load_dir", None)
    if load and not qwen_vl:
        raise ArgumentError("pretrain_mm.py: a llava model.json has no single Hugging Face directory; give the "
                            "decoder's and the tower's as text_decoder.ckpt_path and "
                            "image_encoder.vision_encoder.ckpt_path instead of --hf-load-dir")
    if load:
        from adaptor.convert import ConversionError, HfCheckpoint

        if getattr(args, "pretrained_checkpoint", None):
            raise ArgumentError("--hf-load-dir and --pretrained-checkpoint both give initial weights; pass one")
        try:
            HfCheckpoint(model_cfg.init_from_hf_path).names()
        except ConversionError as exc:
            raise ArgumentError(f"--hf-load-dir {load}: {exc}") from None
    save = getattr(args, "hf_save_dir", None)
    if save is None:
        return
    if not qwen_vl:
        raise ArgumentError(f"pretrain_mm.py: --hf-save-dir writes Qwen2.5-VL / Qwen3-VL models; "
                            f"model_id {model_cfg.model_id} has no Hugging Face form here")
    if getattr(args, "hf_save_lora", None) or getattr(args, "lora_r", None):
        raise ArgumentError("pretrain_mm.py: --hf-save-dir does not write LoRA layers")
    final = Path(save)
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise ArgumentError(f"--hf-save-dir {save} exists and is not an empty directory")
    if not final.absolute().parent.is_dir():
        raise ArgumentError(f"--hf-save-dir {save}: parent directory does not exist")


class QwenVlHfSave(Feature):
    name = "qwen_vl_hf_save"

    def enabled(self, ctx) -> bool:
        flags = ctx.flags
        return super().enabled(ctx) and bool(getattr(flags, "mm_model", None)) and bool(
            getattr(flags, "hf_load_dir", None) or getattr(flags, "hf_save_dir", None))

    def register_patches(self, pm, ctx) -> None:
        if getattr(ctx.flags, "hf_save_dir", None):
            pm.register_wrapper("megatron.training.training.train", train_then_save, OWNER)

    def validate(self, args, ctx) -> None:
        from adaptor.mm.config import run_model_config

        check_hf_flags(args, run_model_config(args))
