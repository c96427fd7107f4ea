"""Initial weights of LLaVAModel's parts, from the checkpoints model.json names (``ckpt_path``).

* ``text_decoder.ckpt_path``: a Qwen3 checkpoint converted by tools/convert_ckpt.py (its default
  safetensors output at TP 1, or ``--save-format torch`` at this run's --tensor-model-parallel-size), or a Hugging Face
  Qwen3 directory (config.json + safetensors, split for any TP size on the fly). Its config.json
  must describe the decoder model.json and the flags build (the check ``--hf-load-dir`` does).
* ``image_encoder.vision_encoder.ckpt_path``: a Hugging Face CLIP or SigLIP directory (vision model
  or full model), through :mod:`adaptor.convert.clip_vision`; its config.json must agree with
  model.json's vision_encoder keys.

Each rank reads only the tensors it holds (memory-mapped) and copies them into its module before
Megatron wraps the model and builds the optimizer, so fp32 main params and every later copy start
from these weights; a ``--load`` checkpoint, read afterwards, still wins (resume). The projector
starts from its random initialization. Every parameter of a loaded part must receive a value.
"""
from __future__ import annotations

import math
from pathlib import Path


from adaptor.convert import ConversionError, HfCheckpoint, Layout, megatron_rank_tensors
from adaptor.convert.online import copy_into
from adaptor.log import notice


def _check_decoder_config(args, hf_config: dict) -> None:
    from adaptor.convert.config_check import config_mismatch, model_flags

    if hf_config.get("model_type") not in (None, "qwen3"):
        raise ConversionError(f"config.json has model_type {hf_config.get('model_type')!r}; the text decoder "
                              f"loads qwen3")
    mismatch = config_mismatch(args, model_flags("qwen3", hf_config))
    if mismatch:
        raise ConversionError(f"config.json does not describe this decoder: {mismatch} "
                              f"(model.json's text_decoder keys set those flags)")


def text_decoder_tensors(path: str, args, tp_rank: int):
    """(name, tensor) of this TP rank's GPTModel from a converted checkpoint or a HF Qwen3 directory."""
    from adaptor.convert import MegatronCheckpoint

    root = Path(path)
    tp = args.tensor_model_parallel_size
    if (root / "latest_checkpointed_iteration.txt").is_file():
        mg = MegatronCheckpoint(root)
        if mg.model_type != "qwen3":
            raise ConversionError(f"the checkpoint holds a {mg.model_type} model; the text decoder loads qwen3")
        _check_decoder_config(args, mg.hf_config)
        if (mg.layout.tp, mg.layout.pp, mg.layout.ep) != (tp, 1, 1):
            held = "whole tensors (safetensors)" if mg.save_format == "safetensors" else \
                f"converted for TP={mg.layout.tp} PP={mg.layout.pp}"
            raise ConversionError(f"{held}; this run has TP={tp} PP=1 (convert with --save-format torch "
                                  f"--target-tensor-parallel-size {tp}, or give the Hugging Face directory, which "
                                  f"is split on the fly)")
        if mg.padded_vocab_size != args.padded_vocab_size:
            raise ConversionError(f"the checkpoint's padded vocabulary is {mg.padded_vocab_size} rows, the model's "
                                  f"{args.padded_vocab_size}; set text_decoder.vocab_size to {mg.padded_vocab_size}")
        return list(mg.state((tp_rank, 0, 0)).items())
    if (root / "config.json").is_file():
        hf = HfCheckpoint(root)
        _check_decoder_config(args, hf.config)
        if args.padded_vocab_size < int(hf.config["vocab_size"]):
            raise ConversionError(f"vocab_size {hf.config['vocab_size']} in config.json is more than the model's "
                                  f"{args.padded_vocab_size} rows; set text_decoder.vocab_size to "
                                  f"{math.ceil(int(hf.config['vocab_size']) / tp) * tp}")
        return megatron_rank_tensors(hf, "qwen3", Layout(tp=tp), tp_rank, padded_vocab_size=args.padded_vocab_size)
    raise ConversionError("neither a converted Megatron checkpoint (latest_checkpointed_iteration.txt) nor a "
                          "Hugging Face directory (config.json)")


def vision_tower_tensors(path: str, vision: dict, tp: int, tp_rank: int):
    """(name, tensor) of this TP rank's CLIPViTModel from a HF CLIP/SigLIP directory."""
    from adaptor.convert.clip_vision import vision_mapping

    hf = HfCheckpoint(path)
    mapping = vision_mapping(vision["model_id"], hf.config, vision["num_layers"], hf.names())
    for key, value in mapping.model_json_values().items():
        mine = vision[key]
        same = math.isclose(mine, value, rel_tol=1e-9) if isinstance(mine, float) else mine == value
        if not same:
            raise ConversionError(f"model.json's vision_encoder {key} is {mine!r} but config.json says {value!r}")
    layout = Layout(tp=tp)
    mapping.check_layout(layout)
    return megatron_rank_tensors(hf, mapping, layout, tp_rank, padded_vocab_size=1)


def load_initial_weights(model, model_cfg, args) -> None:
    """Fill the parts model.json gives a ``ckpt_path`` for; one error line names the file and key."""
    from megatron.core import mpu

    from adaptor.errors import fail

    tp, tp_rank = args.tensor_model_parallel_size, mpu.get_tensor_model_parallel_rank()
    parts = [("text", "text decoder", model.language_model,
              lambda path: text_decoder_tensors(path, args, tp_rank)),
             ("vision", "vision tower", model.vision_model,
              lambda path: vision_tower_tensors(path, model_cfg.vision, tp, tp_rank))]
    for section, what, module, tensors in parts:
        path = getattr(model_cfg, section)["ckpt_path"]
        if path is None or module is None:
            continue
        try:
            count = copy_into(module, tensors(path), what)
        except (ConversionError, OSError, KeyError) as exc:
            fail(f"{model_cfg.where(section, 'ckpt_path')} {path}: {exc}")
        notice(f"{what}: {count} tensors on rank 0 loaded from {path}")
