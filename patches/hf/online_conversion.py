"""``--hf-load-dir`` / ``--hf-save-dir``: train from, and save to, a Hugging Face directory (online conversion).

Upstream functions wrapped:

* ``megatron.training.training.setup_model_and_optimizer``: without a ``--load`` checkpoint, each
  rank fills its own shard from the HF safetensors (:func:`adaptor.convert.megatron_rank_tensors`,
  no temporary Megatron checkpoint) and refreshes the optimizer's main params; an existing ``--load``
  wins (resume).
* ``megatron.training.training.train``: afterwards each expert-data-parallel rank 0 writes its state
  beside ``--hf-save-dir`` and rank 0 writes the HF directory (:func:`adaptor.convert.hf_writer.write_hf_dir`,
  renamed into place; the ranks must share a filesystem). config.json comes from ``--hf-load-dir``
  or from the flags (``--model-type-hf``). With LoRA, ``--hf-load-dir`` fills the base only and
  ``--hf-save-lora`` picks ``adapter`` (PEFT directory, :mod:`adaptor.convert.lora`) or ``merged``.
* ``megatron.core.tokenizers.utils.build_tokenizer._set_padded_vocab_size``: the padded vocabulary
  is at least the HF ``vocab_size`` (Qwen3: 151936 rows, tokenizer 151669), so the embedding loads
  whole; a tokenizer larger than the checkpoint's vocabulary is an error.
* Defaults: such a run that ``--save``s without ``--ckpt-format`` saves ``safetensors``.
* ``megatron.training.arguments.validate_args``: the flags
  :func:`adaptor.convert.megatron_args_from_hf_config` derives from the HF config must match the
  command line; the first difference is one line naming the flag.

Not enabled for ``--mm-model`` runs: patches/multimodal/qwen_vl_hf_save.py owns these flags there and
reuses :func:`adaptor.convert.online.save_hf_dir` with the Qwen-VL writer.
"""
from __future__ import annotations

import json
from pathlib import Path

from adaptor.convert.config_check import HF_MODEL_TYPES, config_mismatch, hf_model_type, model_flags, read_hf_config
from adaptor.convert.online import hf_config_from_args, load_hf_weights, save_hf_dir
from adaptor.features import ArgumentError, Feature
from adaptor.wrapping import argument
from adaptor.log import notice

OWNER = __name__
# ----------------------------------------------------------------------------- loading
def _setup_model_and_optimizer(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args
    from megatron.training.checkpointing import checkpoint_exists

    from adaptor.convert import ConversionError
    from adaptor.errors import fail

    args = get_args()
    resume = checkpoint_exists(args.load)
    model, optimizer, scheduler = wrapped(*call_args, **kwargs)
    if args.hf_load_dir is None:
        return model, optimizer, scheduler
    if resume:
        notice(f"--load {args.load} has a checkpoint: resuming from it, not from --hf-load-dir")
        return model, optimizer, scheduler
    try:
        count = load_hf_weights(model, args)
    except (ConversionError, OSError) as exc:
        fail(f"--hf-load-dir {args.hf_load_dir}: {exc}")
    if optimizer is not None:
        optimizer.reload_model_params()
    args.iteration = 0
    args.num_floating_point_operations_so_far = 0
    notice(f"rank 0 loaded its {count} tensors from Hugging Face directory {args.hf_load_dir} "
           f"({args.model_type_hf}); training starts at iteration 0")
    return model, optimizer, scheduler


# ----------------------------------------------------------------------------- saving
def _train(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    result = wrapped(*call_args, **kwargs)
    args = get_args()
    if args.hf_save_dir is not None:
        model = call_args[1] if len(call_args) > 1 else kwargs["model"]
        save_hf_dir(model, args, result[0])
    return result


# ----------------------------------------------------------------------------- arguments
def _set_padded_vocab_size(wrapped, instance, call_args, kwargs):
    args = argument(call_args, kwargs, "args")
    tokenizer = call_args[1] if len(call_args) > 1 else kwargs.get("tokenizer")
    explicit = getattr(args, "padded_vocab_size", None) is not None
    result = wrapped(*call_args, **kwargs)
    if args.hf_load_dir is not None:
        from adaptor.errors import fail

        hf_vocab = json.loads((Path(args.hf_load_dir) / "config.json").read_text())["vocab_size"]
        if tokenizer is not None and tokenizer.vocab_size > hf_vocab:
            fail(f"--hf-load-dir {args.hf_load_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the "
                 f"checkpoint's vocab_size is {hf_vocab}; use the checkpoint's tokenizer")
        if not explicit:
            tp = args.tensor_model_parallel_size
            args.padded_vocab_size = max(args.padded_vocab_size, -(-hf_vocab // tp) * tp)
    return result


def _validate_args(wrapped, instance, call_args, kwargs):
    from adaptor.convert import ConversionError
    from adaptor.errors import fail

    result = wrapped(*call_args, **kwargs)
    args = argument(call_args, kwargs, "args")
    if args.hf_load_dir is not None:
        where = f"--hf-load-dir {args.hf_load_dir}"
        config = json.loads((Path(args.hf_load_dir) / "config.json").read_text())
    else:
        where = "--hf-save-dir"
        try:
            config = hf_config_from_args(args)
        except (TypeError, ValueError, AttributeError) as exc:
            fail(f"--hf-save-dir: cannot describe this model as {args.model_type_hf}: {exc}")
        if config["vocab_size"] is None:
            # A tokenizer's vocabulary (HuggingFaceTokenizer, no --vocab-size) is known once Megatron builds it,
            # after validation; the saved config.json takes the padded size then. It is not compared here.
            config["vocab_size"] = 1
    try:
        mismatch = config_mismatch(args, model_flags(args.model_type_hf, config))
    except ConversionError as exc:
        fail(f"{where}: {exc}")
    if mismatch:
        if args.hf_load_dir is not None:
            fail(f"{where}: config.json does not match the command line: {mismatch}")
        fail(f"--hf-save-dir: a {args.model_type_hf} config cannot describe this model: {mismatch}")
    return result


class OnlineConversion(Feature):
    name = "online_conversion"

    def add_arguments(self, group) -> None:
        group.add_argument("--hf-load-dir", default=None, dest="hf_load_dir", metavar="DIR",
                           help="Start training from this Hugging Face directory (config.json + safetensors): "
                                "each rank reads its own shard; a --load checkpoint that exists wins.")
        group.add_argument("--hf-save-dir", default=None, dest="hf_save_dir", metavar="DIR",
                           help="At the end of training write the model as a Hugging Face directory here.")
        group.add_argument("--hf-save-lora", default=None, dest="hf_save_lora", choices=("adapter", "merged"),
                           help="With LoRA: --hf-save-dir writes a PEFT adapter directory (adapter, the default) "
                                "or the full model with the adapters merged into the weights (merged).")
        group.add_argument("--model-type-hf", default=None, dest="model_type_hf",
                           choices=sorted(set(HF_MODEL_TYPES.values())),
                           help="Architecture of --hf-load-dir/--hf-save-dir (default: config.json's model_type).")

    def enabled(self, ctx) -> bool:
        flags = ctx.flags
        if getattr(flags, "mm_model", None):  # pretrain_mm.py's models: patches/multimodal/qwen_vl_hf_save.py
            return False
        return super().enabled(ctx) and bool(getattr(flags, "hf_load_dir", None) or getattr(flags, "hf_save_dir", None)
                                             or getattr(flags, "hf_save_lora", None))

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.setup_model_and_optimizer", _setup_model_and_optimizer, OWNER)
        pm.register_wrapper("megatron.training.training.train", _train, OWNER)
        pm.register_wrapper("megatron.core.tokenizers.utils.build_tokenizer._set_padded_vocab_size",
                            _set_padded_vocab_size, OWNER)
        pm.register_wrapper("megatron.training.arguments.validate_args", _validate_args, OWNER)

    def set_defaults(self, args, ctx) -> None:
        if (getattr(args, "save", None) and "ckpt_format" not in ctx.explicit
                and not getattr(args, "use_megatron_fsdp", False) and args.ckpt_format != "safetensors"):
            from adaptor.log import notice_once

            args.ckpt_format = "safetensors"
            notice_once("--hf-load-dir/--hf-save-dir: --save checkpoints use --ckpt-format safetensors "
                        "(no pickle; pass --ckpt-format to choose another)", key="hf_ckpt_format")

    def validate(self, args, ctx) -> None:
        if args.hf_load_dir is not None:
            config = read_hf_config(args.hf_load_dir, "--hf-load-dir")
            args.model_type_hf = hf_model_type(config, args.model_type_hf, f"--hf-load-dir {args.hf_load_dir}")
            from adaptor.convert import ConversionError, HfCheckpoint

            try:
                HfCheckpoint(args.hf_load_dir).names()
            except ConversionError as exc:
                raise ArgumentError(f"--hf-load-dir {args.hf_load_dir}: {exc}") from None
            if getattr(args, "pretrained_checkpoint", None):
                raise ArgumentError("--hf-load-dir and --pretrained-checkpoint both give initial weights; pass one")
            explicit_padded = getattr(args, "padded_vocab_size", None)
            if explicit_padded is not None and explicit_padded < config.get("vocab_size", 0):
                raise ArgumentError(f"--padded-vocab-size {explicit_padded} is smaller than vocab_size "
                                    f"{config['vocab_size']} of --hf-load-dir {args.hf_load_dir}")
        if getattr(args, "hf_save_lora", None) is not None:
            if args.hf_save_dir is None:
                raise ArgumentError(f"--hf-save-lora {args.hf_save_lora} needs --hf-save-dir")
            if not getattr(args, "lora_r", None):
                raise ArgumentError(f"--hf-save-lora {args.hf_save_lora} needs LoRA layers (--lora-r)")
        if args.hf_save_dir is not None:
            if args.model_type_hf is None:
                raise ArgumentError("--hf-save-dir without --hf-load-dir needs --model-type-hf "
                                    + "|".join(dict.fromkeys(HF_MODEL_TYPES.values())))
            final = Path(args.hf_save_dir)
            if final.exists() and (not final.is_dir() or any(final.iterdir())):
                raise ArgumentError(f"--hf-save-dir {args.hf_save_dir} exists and is not an empty directory")
            if not final.absolute().parent.is_dir():
                raise ArgumentError(f"--hf-save-dir {args.hf_save_dir}: parent directory does not exist")
        uneven = [flag for flag, dest in (("--decoder-first-pipeline-num-layers", "decoder_first_pipeline_num_layers"),
                                          ("--decoder-last-pipeline-num-layers", "decoder_last_pipeline_num_layers"),
                                          ("--pipeline-model-parallel-layout", "pipeline_model_parallel_layout"))
                  if getattr(args, dest, None)]
        if uneven:
            raise ArgumentError(f"--hf-load-dir/--hf-save-dir split layers evenly over pipeline stages (virtual "
                                f"ones included); {uneven[0]} is not supported with them")
        if args.num_layers and args.num_layers % args.pipeline_model_parallel_size:
            raise ArgumentError(f"--num-layers {args.num_layers} is not divisible by "
                                f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size}")
