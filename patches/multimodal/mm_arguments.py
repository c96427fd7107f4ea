"""``--mm-model model.json --mm-data data.json``: pretrain_mm.py's configuration files.

No upstream function is changed; the files join Megatron's argument handling (``adaptor.arguments_hook``
around ``parse_args``/``validate_args``). As in MindSpeed-MM, model.json's ``text_decoder`` fills the
GPTModel flags (``num_layers`` → ``--num-layers``, ``activation_func: silu`` → ``--swiglu``, ...;
``vocab_size`` the padded vocabulary), a disagreeing command-line flag is one line naming both, and
``dataloader_param.num_workers`` sets ``--num-workers`` unless given. One-line checks: files and
paths, tower/projector widths vs TP, image sizes, room for text in ``--seq-length``, a tokenizer, and
layouts LLaVAModel does not run here (PP, CP, ``--sequence-parallel`` without TE attention); for
Qwen2.5-VL / Qwen3-VL, TP and PP (deepstack layers on the first stage), no CP or sequence parallelism.
"""
from __future__ import annotations

import json
import math
import os

from adaptor.features import ArgumentError, Feature
from adaptor.mm.config import image_seq_len

# Flag spelled differently from its dest.
_FLAG_OF = {"add_bias_linear": "--disable-bias-linear", "layernorm_epsilon": "--norm-epsilon"}


def _flag(dest: str) -> str:
    return _FLAG_OF.get(dest, "--" + dest.replace("_", "-"))


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def text_decoder_args(text: dict) -> dict:
    """Megatron dest -> value for the text_decoder keys model.json gives."""
    from adaptor.mm.config import TEXT_DECODER_ARGS

    out = {dest: text[key] for key, dest in TEXT_DECODER_ARGS.items() if text.get(key) is not None}
    if text.get("swiglu") is not None:
        out["swiglu"] = text["swiglu"]
    if "num_query_groups" in out:
        out["group_query_attention"] = out["num_query_groups"] != text["num_attention_heads"]
    return out


def apply_model_json(args, explicit: set, model_cfg) -> None:
    """Fill the decoder flags from model.json; a flag given explicitly must agree with it."""
    from adaptor.mm.config import MMConfigError, TEXT_DECODER_ARGS

    key_of = {dest: key for key, dest in TEXT_DECODER_ARGS.items()}
    key_of["swiglu"] = "gated_linear_unit/activation_func"
    for dest, value in text_decoder_args(model_cfg.text).items():
        if dest == "group_query_attention":
            args.group_query_attention = value
            continue
        if dest in explicit and not _same(getattr(args, dest), value):
            given = getattr(args, dest)
            # A switch is explicit only when present, so naming it says its value.
            flag = _flag(dest) if isinstance(given, bool) else f"{_flag(dest)} {given}"
            raise MMConfigError(f"{model_cfg.where('text', key_of[dest])} is {json.dumps(value)} but the command "
                                f"line has {flag}; drop the flag or change model.json")
        setattr(args, dest, value)
    vocab = model_cfg.text.get("vocab_size")
    if vocab is not None:
        tp = args.tensor_model_parallel_size
        if vocab % tp:
            raise MMConfigError(f"{model_cfg.where('text', 'vocab_size')}: {vocab} is not divisible by "
                                f"--tensor-model-parallel-size {tp}")
        args.padded_vocab_size = vocab


def check_qwen_vl_layout(args, model_cfg) -> None:
    """What the Qwen-VL model runs on: TP and PP (the tower on the first stage, deepstack layers there too)."""
    from adaptor.mm.qwen_vl.model_json import text_config, vision_settings

    settings, text = vision_settings(model_cfg), text_config(model_cfg)
    if (getattr(args, "context_parallel_size", 1) or 1) > 1 or getattr(args, "sequence_parallel", False):
        raise ArgumentError(f"pretrain_mm.py: {model_cfg.model_id} places image rows in the whole sequence: "
                            f"--context-parallel-size > 1 and --sequence-parallel are not supported")
    if getattr(args, "virtual_pipeline_model_parallel_size", None) or \
            getattr(args, "num_layers_per_virtual_pipeline_stage", None):
        raise ArgumentError(f"pretrain_mm.py: {model_cfg.model_id} runs without virtual pipeline stages")
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    for what, value in (("vision_config num_heads", settings.num_heads),
                        ("vision_config intermediate_size", settings.intermediate_size),
                        ("the merger width", settings.merge_unit * settings.hidden_size)):
        if value % tp:
            raise ArgumentError(f"{model_cfg.file}: {what} {value} is not divisible by "
                                f"--tensor-model-parallel-size {tp}")
    for flag in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
        if getattr(args, flag, None) is not None:  # the weight mappings place layers by an even split
            raise ArgumentError(f"pretrain_mm.py: {model_cfg.model_id} splits the decoder evenly over the pipeline "
                                f"stages; drop --{flag.replace('_', '-')}")
    first = text.num_layers // pp
    stacked = len(settings.deepstack_visual_indexes)
    if pp > 1 and stacked > first:
        raise ArgumentError(f"pretrain_mm.py: {model_cfg.model_id} adds deepstack features after decoder layers "
                            f"1..{stacked}, which must lie on the first pipeline stage; it holds {first} at "
                            f"--pipeline-model-parallel-size {pp}")


def check_layout(args, model_cfg, data_cfg) -> None:
    """The layout against model.json, and (``data_cfg`` given: training) the images against the sequence."""
    if model_cfg.model_id != "llava":
        if _generation_entry():
            raise ArgumentError(f"{_generation_entry()} runs the language model of a llava model.json; "
                                f"{model_cfg.model_id} is not supported there")
        check_qwen_vl_layout(args, model_cfg)
        return
    vision, projector = model_cfg.vision, model_cfg.projector
    tp = args.tensor_model_parallel_size
    for flag, dest in (("--pipeline-model-parallel-size", "pipeline_model_parallel_size"),
                       ("--context-parallel-size", "context_parallel_size")):
        if (getattr(args, dest, 1) or 1) > 1:
            raise ArgumentError(f"pretrain_mm.py: {flag} > 1 is not supported (LLaVAModel runs here with data "
                                f"and tensor parallelism)")
    if getattr(args, "sequence_parallel", False):
        raise ArgumentError("pretrain_mm.py: --sequence-parallel is not supported (megatron-core's LLaVAModel "
                            "allows it only with Transformer Engine attention)")
    for key in ("num_attention_heads", "ffn_hidden_size"):
        if vision[key] % tp:
            raise ArgumentError(f"{model_cfg.where('vision', key)} {vision[key]} is not divisible by "
                                f"--tensor-model-parallel-size {tp}")
    width = projector["ffn_hidden_size"] or args.hidden_size
    if projector["model_id"] == "mlp" and width % tp:
        raise ArgumentError(f"{model_cfg.where('projector', 'ffn_hidden_size')} {width} is not divisible by "
                            f"--tensor-model-parallel-size {tp}")
    if data_cfg is None:
        return
    if data_cfg.image_size != vision["image_size"]:
        raise ArgumentError(f"{data_cfg.file}: dataset_param.preprocess_parameters.image_size is "
                            f"{data_cfg.image_size} but {model_cfg.where('vision', 'image_size')} is "
                            f"{vision['image_size']}")
    images = image_seq_len(vision)
    if args.seq_length is not None and args.seq_length - images + 1 < 2:
        raise ArgumentError(f"--seq-length {args.seq_length} leaves no room for text: one image takes {images} "
                            f"positions ((image_size / patch_size)^2"
                            f"{' + class token' if images > (vision['image_size'] // vision['patch_size']) ** 2 else ''})")


def check_files(model_cfg, data_cfg) -> None:
    from adaptor.mm.config import MMConfigError
    from adaptor.mm.qwen_vl.data_config import QwenVLDataConfig, check_paths

    qwen_data, qwen_model = isinstance(data_cfg, QwenVLDataConfig), model_cfg.model_id != "llava"
    if qwen_data != qwen_model:
        kind, feeds = ("huggingface", "qwen2_5vl or qwen3vl") if qwen_data else ("multimodal", "llava")
        raise ArgumentError(f"{data_cfg.file}: a {kind} data.json feeds model_id {feeds}; {model_cfg.file} has "
                            f"model_id {model_cfg.model_id}")
    if qwen_model:  # init_from_hf_path was read with model.json
        from adaptor.mm.qwen_vl.token_ids import check_data_tokenizer

        try:
            check_paths(data_cfg)
            check_data_tokenizer(model_cfg, data_cfg)
        except MMConfigError as exc:
            raise ArgumentError(str(exc)) from None
        return
    if not os.path.isfile(data_cfg.data_path):
        raise ArgumentError(f"{data_cfg.file}: dataset_param.basic_parameters.data_path: no such file "
                            f"{data_cfg.data_path}")
    if not os.path.isdir(data_cfg.data_folder):
        raise ArgumentError(f"{data_cfg.file}: dataset_param.basic_parameters.data_folder: no such directory "
                            f"{data_cfg.data_folder}")
    for section in ("vision", "text"):
        path = getattr(model_cfg, section)["ckpt_path"]
        if path is not None and not os.path.isdir(path):
            raise ArgumentError(f"{model_cfg.where(section, 'ckpt_path')}: no such directory {path}")


def check_tokenizer_model(args, model_cfg) -> None:
    """``--tokenizer-model``, when it is a tokenizer.json directory, against a Qwen-VL model.json's ids."""
    from tokenizers import Tokenizer

    from adaptor.mm.config import MMConfigError
    from adaptor.mm.qwen_vl.token_ids import check_tokenizer_matches_model
    from adaptor.tokenizer_json import find_tokenizer_json

    path = getattr(args, "tokenizer_model", None)
    found = find_tokenizer_json(path) if path and os.path.isdir(path) else None
    if model_cfg.model_id == "llava" or found is None:
        return
    try:
        check_tokenizer_matches_model(model_cfg, Tokenizer.from_file(str(found)), f"--tokenizer-model {path}")
    except MMConfigError as exc:
        raise ArgumentError(str(exc)) from None


def _generation_entry() -> str | None:
    """inference.py or evaluation.py when one of them runs: they build model.json's model and use its
    language model on text."""
    from adaptor.inference import ENTRY

    return "inference.py" if ENTRY["inference"] else "evaluation.py" if ENTRY["evaluation"] else None


class MultimodalArguments(Feature):
    name = "mm_arguments"

    def add_arguments(self, group) -> None:
        group.add_argument("--mm-model", default=None, dest="mm_model", metavar="JSON",
                           help="pretrain_mm.py: model.json (image_encoder.vision_encoder/vision_projector, "
                                "text_decoder); its text_decoder keys fill the decoder's Megatron flags. "
                                "inference.py and evaluation.py: the model a pretrain_mm.py --load checkpoint "
                                "holds, whose language model they run on text.")
        group.add_argument("--mm-data", default=None, dest="mm_data", metavar="JSON",
                           help="pretrain_mm.py: data.json (dataset_param, dataloader_param).")
        group.add_argument("--mm-skip-bad-records", action="store_true", dest="mm_skip_bad_records",
                           help="pretrain_mm.py: count and skip records with a missing key, an empty caption "
                                "or a missing/undecodable image instead of stopping at the first.")

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "mm_model", None))

    def set_defaults(self, args, ctx) -> None:
        from adaptor.errors import fail
        from adaptor.log import notice_once
        from adaptor.mm.config import MMConfigError, run_model_config
        from adaptor.mm.qwen_vl.data_config import cached_mm_data_config

        generating = _generation_entry()
        if args.mm_data is None and not generating:
            fail("--mm-model needs --mm-data data.json (pretrain_mm.py)")
        if args.mm_data is not None and generating:
            fail(f"--mm-data: {generating} reads no dataset; drop it (--mm-model model.json builds the model)")
        try:
            model_cfg = run_model_config(args)
            apply_model_json(args, ctx.explicit, model_cfg)
            if model_cfg.taken_from_hf:
                notice_once(f"{model_cfg.file}: {', '.join(model_cfg.taken_from_hf)} = 999999 taken from "
                            f"{model_cfg.init_from_hf_path}/config.json")
            for line in model_cfg.patch_notices:
                notice_once(line)
            data_cfg = None if generating else cached_mm_data_config(args.mm_data)
        except MMConfigError as exc:
            fail(str(exc))
        if data_cfg is not None and data_cfg.num_workers is not None and "num_workers" not in ctx.explicit:
            args.num_workers = data_cfg.num_workers

    def validate(self, args, ctx) -> None:
        from adaptor.mm.config import run_model_config
        from adaptor.mm.qwen_vl.data_config import cached_mm_data_config

        model_cfg = run_model_config(args)
        if _generation_entry():  # the text side of a trained checkpoint: no data, no initial weights
            check_layout(args, model_cfg, None)
        else:
            data_cfg = cached_mm_data_config(args.mm_data)
            check_files(model_cfg, data_cfg)
            check_tokenizer_model(args, model_cfg)
            check_layout(args, model_cfg, data_cfg)
        if args.tokenizer_type == "NullTokenizer":
            raise ArgumentError("pretrain_mm.py tokenizes captions: --tokenizer-type NullTokenizer cannot; use "
                                "HuggingFaceTokenizer with --tokenizer-model")
