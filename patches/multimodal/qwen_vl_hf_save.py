"""``pretrain_mm.py --hf-save-dir DIR`` for Qwen2.5-VL / Qwen3-VL: the model as a Hugging Face directory.

Wraps ``megatron.training.training.train`` as ``--hf-save-dir`` does for GPT models
(patches/hf/online_conversion.py): after the last iteration every rank hands its state over and rank 0
writes ``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` tensors
(:func:`adaptor.mm.qwen_vl.hf_export.save_vl_hf_dir`), all or nothing.

Enabled for ``--mm-model`` runs that name ``--hf-load-dir`` or ``--hf-save-dir`` (the GPT feature steps
aside for them); ``--hf-load-dir`` is refused in one line: model.json's ``init_from_hf_path`` gives the
initial weights and describes the model, and a second directory could disagree with it.
"""
from __future__ import annotations

from pathlib import Path

from adaptor.features import ArgumentError, Feature

OWNER = __name__


def train_then_save(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    from adaptor.mm.config import cached_model_config
    from adaptor.mm.qwen_vl.hf_export import save_vl_hf_dir

    result = wrapped(*call_args, **kwargs)
    args = get_args()
    if args.hf_save_dir is not None:
        model = call_args[1] if len(call_args) > 1 else kwargs["model"]
        save_vl_hf_dir(model, args, result[0], cached_model_config(args.mm_model))
    return result


def check_hf_flags(args, model_cfg) -> None:
    """One line for what a multimodal run cannot do with ``--hf-load-dir`` / ``--hf-save-dir``."""
    qwen_vl = model_cfg.hf_config is not None
    if getattr(args, "hf_load_dir", None):
        # Refused, not mapped: model.json's init_from_hf_path also describes the architecture (config.json),
        # so a second source of initial weights could disagree with the model that is built.
        raise ArgumentError(
            f"pretrain_mm.py: --hf-load-dir is not read; give the Hugging Face directory as model.json's "
            + ("init_from_hf_path (it also describes the model)" if qwen_vl
               else "text_decoder.ckpt_path (llava: the text decoder's checkpoint)"))
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
        from adaptor.mm.config import cached_model_config

        check_hf_flags(args, cached_model_config(args.mm_model))
