#!/usr/bin/env python
"""Convert checkpoints between Hugging Face and Megatron (safetensors, or legacy torch format), MindSpeed-LLM style.

    python tools/convert_ckpt.py --load-model-type hf --save-model-type mg --model-type-hf qwen3 \\
        --load-dir Qwen3-0.6B --save-dir qwen3-mg-tp2 --target-tensor-parallel-size 2
    python tools/convert_ckpt.py --load-model-type mg --save-model-type hf \\
        --load-dir qwen3-mg-tp2 --save-dir Qwen3-0.6B-back

hf -> mg writes a release checkpoint that ``pretrain_gpt.py --load DIR`` reads: by default in the
safetensors format (one file of whole tensors, no pickle; any TP/PP/EP layout loads it), with
``--save-format torch`` as Megatron's legacy rank files at the target layout. It keeps config.json
(and tokenizer files) under DIR/hf so that mg -> hf needs nothing else; mg -> hf reads either
format (torch files with ``weights_only=True``: a file that names anything else is refused).
Tensors stream one at a time; --save-dir is written beside itself under a temporary name and
renamed at the end.

Qwen2.5-VL / Qwen3-VL (``--model-type-hf qwen2_5_vl|qwen3_vl --mm-model model.json``): hf -> mg writes
legacy torch rank files at the target TP x PP (a release that ``pretrain_mm.py --mm-model model.json
--load DIR`` loads strictly); mg -> hf reads such rank files (or a pretrain_mm.py --ckpt-format torch
checkpoint) and writes the directory under init_from_hf_path's tensor names, as tools/qwen_vl_to_hf.py.
model.json gives the architecture; its model_id must be the checkpoint's. The vocabulary is not padded
(pretrain_mm.py takes config.json's vocab_size as the padded size): --make-vocab-size-divisible-by
does not apply.
"""
from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__":  # quiet import summary for the tool only; importing this module changes no environment
    warnings.filterwarnings("ignore")  # import-time notices of megatron/torch; errors are one line below
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

PROG = "convert_ckpt.py"
VL_MODEL_TYPES = ("qwen2_5_vl", "qwen3_vl")  # whole vision-language models: --mm-model model.json


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-model-type", choices=["hf", "mg"], required=True)
    parser.add_argument("--save-model-type", choices=["hf", "mg"], required=True)
    parser.add_argument("--load-dir", required=True)
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--model-type-hf", choices=["qwen3", "deepseek3", "llama2", "qwen2", "qwen3-moe", "mixtral",
                                                        *VL_MODEL_TYPES],
                        help="architecture (required for hf -> mg; mg -> hf reads it from the checkpoint)")
    parser.add_argument("--target-tensor-parallel-size", type=int, default=1)
    parser.add_argument("--target-pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--target-expert-parallel-size", type=int, default=1)
    parser.add_argument("--target-expert-tensor-parallel-size", type=int, default=None,
                        help="1 or the tensor parallel size (Megatron's default)")
    parser.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None, metavar="N",
                        help="hf -> mg: interleaved virtual pipeline stages of N layers, as pretrain_gpt.py's flag "
                             "(checked; torch rank files hold model0, model1, ...; the safetensors release "
                             "loads at any layout as it is)")
    parser.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                        help="as pretrain_gpt.py's flag: the vocabulary is padded to a multiple of this times TP")
    parser.add_argument("--mm-model", default=None, metavar="JSON",
                        help="qwen2_5_vl / qwen3_vl: the pretrain_mm.py run's model.json (the architecture)")
    parser.add_argument("--save-format", choices=["safetensors", "torch"], default=None,
                        help="hf -> mg: safetensors (default; no pickle, loads at any parallel layout) or torch "
                             "(Megatron's legacy mp_rank_* files, loaded at the target layout)")
    parser.add_argument("--hf-config-dir", help="mg -> hf: directory with config.json when the checkpoint has none")
    parser.add_argument("--max-shard-size", default="5GB", help="mg -> hf: largest safetensors shard, e.g. 2GB, 500MB")
    args = parser.parse_args(argv)
    vl = args.model_type_hf in VL_MODEL_TYPES
    if vl != (args.mm_model is not None):
        parser.error("--mm-model model.json goes with --model-type-hf qwen2_5_vl or qwen3_vl, and they with it")
    if vl and args.save_format == "safetensors":
        parser.error("--model-type-hf {}: --save-format torch only (pretrain_mm.py's rank files)"
                     .format(args.model_type_hf))
    if vl and (args.target_expert_parallel_size != 1 or args.num_layers_per_virtual_pipeline_stage
               or args.target_expert_tensor_parallel_size not in (None, args.target_tensor_parallel_size)):
        parser.error(f"--model-type-hf {args.model_type_hf}: tensor and pipeline parallel sizes only")
    args.save_format = args.save_format or ("torch" if vl else "safetensors")
    if (args.load_model_type, args.save_model_type) not in (("hf", "mg"), ("mg", "hf")):
        parser.error("convert hf -> mg or mg -> hf")
    if args.load_model_type == "hf" and args.model_type_hf is None:
        parser.error("--model-type-hf is required when loading a Hugging Face checkpoint")
    for flag in ("target_tensor_parallel_size", "target_pipeline_parallel_size", "target_expert_parallel_size",
                 "make_vocab_size_divisible_by", "num_layers_per_virtual_pipeline_stage"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    try:
        args.max_shard_bytes = parse_size(args.max_shard_size)
    except ValueError:
        parser.error(f"--max-shard-size {args.max_shard_size!r}: expected a size such as 5GB or 500MB")
    return args


def parse_size(text: str) -> int:
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}
    text = text.strip().upper()
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def virtual_stages(args) -> int:
    """Model chunks per pipeline rank of --num-layers-per-virtual-pipeline-stage (1 without it)."""
    from adaptor.convert import ConversionError, HfCheckpoint

    per_stage = args.num_layers_per_virtual_pipeline_stage
    if per_stage is None:
        return 1
    layers = int(HfCheckpoint(args.load_dir).config.get("num_hidden_layers") or 0)
    per_rank, left = divmod(layers, args.target_pipeline_parallel_size)
    if left or per_rank % per_stage or args.target_pipeline_parallel_size < 2:
        raise ConversionError(f"--num-layers-per-virtual-pipeline-stage {per_stage}: num_hidden_layers={layers} "
                              f"does not split into --target-pipeline-parallel-size "
                              f"{args.target_pipeline_parallel_size} (2 or more) x {per_stage} layers per virtual "
                              f"pipeline stage")
    return per_rank // per_stage


def convert_vision_language(args) -> Path:
    """Qwen2.5-VL / Qwen3-VL either way (adaptor.mm.qwen_vl.hf_export); a model.json of another model_id,
    or a checkpoint that is not model.json's model, is a ConversionError."""
    from adaptor.convert import ConversionError, Layout
    from adaptor.mm.config import MMConfigError, load_model_config
    from adaptor.mm.qwen_vl.hf_export import write_vl_hf_dir, write_vl_megatron_release

    try:
        model_cfg = load_model_config(args.mm_model)
    except MMConfigError as exc:
        raise ConversionError(str(exc)) from None
    family = None if model_cfg.hf_config is None else model_cfg.hf_config["model_type"]
    if family != args.model_type_hf:
        raise ConversionError(f"--mm-model {args.mm_model}: model_id {model_cfg.model_id} is not "
                              f"--model-type-hf {args.model_type_hf}")
    if args.load_model_type == "hf":
        layout = Layout(args.target_tensor_parallel_size, args.target_pipeline_parallel_size)
        return write_vl_megatron_release(args.load_dir, args.save_dir, model_cfg, layout)
    try:
        return write_vl_hf_dir(args.save_dir, iteration_dir_of(args.load_dir), model_cfg)
    except (ValueError, KeyError, OSError) as exc:
        raise ConversionError(f"--load-dir {args.load_dir}: {exc}") from None


def iteration_dir_of(load_dir) -> Path:
    """The iteration directory ``latest_checkpointed_iteration.txt`` of ``load_dir`` names."""
    from adaptor.convert import ConversionError
    from adaptor.convert.torch_legacy import TRACKER_FILE

    tracker = Path(load_dir) / TRACKER_FILE
    if not tracker.is_file():
        raise ConversionError(f"{tracker}: missing (not a Megatron checkpoint directory)")
    text = tracker.read_text().strip()
    if text != "release" and not text.isdigit():
        raise ConversionError(f"{tracker}: does not name an iteration ({text!r})")
    return Path(load_dir) / ("release" if text == "release" else f"iter_{int(text):07d}")


def main(argv=None) -> int:
    from adaptor.command_line.mindspeed_llm import rewrite_convert_argv

    rewrite = rewrite_convert_argv(sys.argv[1:] if argv is None else list(argv))  # MindSpeed-LLM's spellings
    if rewrite.refused:
        print(f"{PROG}: error: {rewrite.refused[0]}", file=sys.stderr)
        return 2
    for note in rewrite.notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    args = parse_args(rewrite.argv)
    from adaptor.convert import ConversionError, Layout, convert_hf_to_megatron, convert_megatron_to_hf

    try:
        if args.model_type_hf in VL_MODEL_TYPES:
            out = convert_vision_language(args)
        elif args.load_model_type == "hf":
            layout = Layout(args.target_tensor_parallel_size, args.target_pipeline_parallel_size,
                            args.target_expert_parallel_size, args.target_expert_tensor_parallel_size,
                            virtual_stages(args))
            out = convert_hf_to_megatron(args.load_dir, args.save_dir, args.model_type_hf, layout,
                                         make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
                                         save_format=args.save_format)
        else:
            out = convert_megatron_to_hf(args.load_dir, args.save_dir, args.model_type_hf,
                                         hf_config_dir=args.hf_config_dir, max_shard_bytes=args.max_shard_bytes)
    except ConversionError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"{PROG}: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
