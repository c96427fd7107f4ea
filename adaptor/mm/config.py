"""model.json and data.json: MindSpeed-MM's shape, checked key by key.

model.json::

    {"model_id": "llava",
     "image_encoder": {"vision_encoder": {...}, "vision_projector": {...}},
     "text_decoder": {...}}

data.json::

    {"dataset_param": {"dataset_type": "multimodal",
                       "basic_parameters": {"data_path": ..., "data_folder": ...},
                       "preprocess_parameters": {"image_size": ..., "mean": [...], "std": [...]}},
     "dataloader_param": {"shuffle": true, "num_workers": 2}}

Problems are one :class:`MMConfigError` naming file and JSON path; relative paths in a file are
relative to its directory.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from adaptor.mm.patch_section import read_patch_section
from adaptor.mm.schema import (  # noqa: F401  (re-exported: the names callers import from here)
    Key, MMConfigError, MMModelConfig, check_section, read_json, resolve,
)

# CLIP's image normalization (OpenAI), the default of preprocess_parameters.mean/std.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


# ------------------------------------------------------------------------------------ model.json
# model_id values of the Qwen-VL family (adaptor.mm.qwen_vl.model_json); MindSpeed-MM spells Qwen3-VL both ways.
QWEN_VL_MODEL_IDS = ("qwen2_5vl", "qwen3vl", "qwen3_vl")


# text_decoder keys and the Megatron argument (dest) each one sets.
TEXT_DECODER_ARGS = {
    "num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
    "num_attention_heads": "num_attention_heads", "num_query_groups": "num_query_groups",
    "kv_channels": "kv_channels", "qk_layernorm": "qk_layernorm", "normalization": "normalization",
    "layernorm_epsilon": "layernorm_epsilon", "add_bias_linear": "add_bias_linear", "add_qkv_bias": "add_qkv_bias",
    "position_embedding_type": "position_embedding_type", "rotary_base": "rotary_base",
    "max_position_embeddings": "max_position_embeddings",
    "untie_embeddings_and_output_weights": "untie_embeddings_and_output_weights",
    "hidden_dropout": "hidden_dropout", "attention_dropout": "attention_dropout",
    "init_method_std": "init_method_std", "mrope_section": "mrope_section",
}

TEXT_DECODER = {
    "model_id": Key(str, True, choices=("qwen3",)),
    "num_layers": Key(int, True), "hidden_size": Key(int, True), "ffn_hidden_size": Key(int, True),
    "num_attention_heads": Key(int, True), "num_query_groups": Key(int), "kv_channels": Key(int),
    "qk_layernorm": Key(bool), "normalization": Key(str, choices=("RMSNorm", "LayerNorm")),
    "layernorm_epsilon": Key(float), "add_bias_linear": Key(bool), "add_qkv_bias": Key(bool),
    "gated_linear_unit": Key(bool), "activation_func": Key(str, choices=("silu", "gelu")),
    "position_embedding_type": Key(str, choices=("rope", "learned_absolute")),
    "rotary_base": Key(int), "max_position_embeddings": Key(int),
    "untie_embeddings_and_output_weights": Key(bool), "vocab_size": Key(int),
    "hidden_dropout": Key(float), "attention_dropout": Key(float), "init_method_std": Key(float),
    "freeze": Key(bool, default=False), "ckpt_path": Key(str),
}

VISION_ENCODER = {
    "model_id": Key(str, True, choices=("clip", "siglip")),
    "num_layers": Key(int, True), "hidden_size": Key(int, True), "ffn_hidden_size": Key(int, True),
    "num_attention_heads": Key(int, True), "patch_size": Key(int, True), "image_size": Key(int, True),
    # Defaults per model_id: quick_gelu and 1e-5 for CLIP, gelu_tanh and 1e-6 for SigLIP.
    "activation_func": Key(str, choices=("quick_gelu", "gelu", "gelu_tanh")),
    "layernorm_epsilon": Key(float),
    # LLaVA feeds the language model the patch features only (CLIP's class token dropped).
    "drop_class_token": Key(bool),
    "hidden_dropout": Key(float, default=0.0), "attention_dropout": Key(float, default=0.0),
    "freeze": Key(bool, default=False), "ckpt_path": Key(str),
}

VISION_PROJECTOR = {
    "model_id": Key(str, default="mlp", choices=("mlp", "affine")),
    "ffn_hidden_size": Key(int),  # mlp: hidden width (default: the text decoder's hidden_size)
    "activation_func": Key(str, default="gelu", choices=("gelu", "quick_gelu", "silu")),
    "add_bias_linear": Key(bool, default=True),
    "freeze": Key(bool, default=False),
}

MODEL = {
    "model_id": Key(str, default="llava", choices=("llava",) + QWEN_VL_MODEL_IDS),
    "image_encoder": {"vision_encoder": VISION_ENCODER, "vision_projector": VISION_PROJECTOR},
    "text_decoder": TEXT_DECODER,
    # Present in MindSpeed-MM's files; only null (absent) is supported here.
    "text_encoder": Key(None), "video_encoder": Key(None),
    "patch": Key("object"),  # MindSpeed-MM's patch switches: adaptor.mm.patch_section
}


def load_model_config(path, hf_load_dir: str | None = None) -> MMModelConfig:
    """model.json checked; ``hf_load_dir`` (``--hf-load-dir``) is a Qwen-VL model's Hugging Face directory
    when the file names none (a llava model.json has no single directory: the flag is refused elsewhere)."""
    raw, file = read_json(path)
    if isinstance(raw, dict) and raw.get("model_id") in QWEN_VL_MODEL_IDS:
        from adaptor.mm.qwen_vl.model_json import load_qwen_vl_model_config

        return load_qwen_vl_model_config(raw, file, str(path), hf_load_dir)
    cfg = check_section(raw, MODEL, "", str(path))
    vision, projector, text = cfg["image_encoder"]["vision_encoder"], cfg["image_encoder"]["vision_projector"], \
        cfg["text_decoder"]
    out = MMModelConfig(str(path), vision, projector, text, patch_notices=read_patch_section(cfg["patch"], str(path)))
    siglip = vision["model_id"] == "siglip"
    if vision["activation_func"] is None:
        vision["activation_func"] = "gelu_tanh" if siglip else "quick_gelu"
    if vision["layernorm_epsilon"] is None:
        vision["layernorm_epsilon"] = 1e-6 if siglip else 1e-5
    if vision["drop_class_token"] is None:
        vision["drop_class_token"] = not siglip
    elif siglip and vision["drop_class_token"]:
        raise MMConfigError(f"{out.where('vision', 'drop_class_token')}: SigLIP has no class token to drop")
    if vision["image_size"] % vision["patch_size"]:
        raise MMConfigError(f"{out.where('vision', 'image_size')}: {vision['image_size']} is not a multiple of "
                            f"patch_size {vision['patch_size']}")
    for section, keys in (("vision", vision), ("text", text)):
        for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads"):
            if keys[key] <= 0:
                raise MMConfigError(f"{out.where(section, key)}: must be positive, got {keys[key]}")
    if vision["hidden_size"] % vision["num_attention_heads"]:
        raise MMConfigError(f"{out.where('vision', 'hidden_size')}: {vision['hidden_size']} is not divisible by "
                            f"num_attention_heads {vision['num_attention_heads']}")
    gated, act = text.pop("gated_linear_unit"), text.pop("activation_func")
    if act == "silu" and gated is False:
        raise MMConfigError(f"{out.where('text', 'activation_func')}: silu without gated_linear_unit is not "
                            f"supported (Megatron's --swiglu is gated)")
    if act == "gelu" and gated:
        raise MMConfigError(f"{out.where('text', 'gated_linear_unit')}: a gated gelu MLP is not supported "
                            f"(use activation_func silu: SwiGLU)")
    text["swiglu"] = bool(gated or act == "silu") if (gated is not None or act is not None) else None
    if vision["freeze"] and projector["freeze"] and text["freeze"]:
        raise MMConfigError(f"{path}: every part is frozen (vision_encoder, vision_projector and text_decoder "
                            f"freeze: true); nothing would train")
    for section in (vision, text):
        section["ckpt_path"] = resolve(file, section["ckpt_path"])
    return out


# ------------------------------------------------------------------------------------- data.json
DATA = {
    "dataset_param": {
        "dataset_type": Key(str, True, choices=("multimodal",)),
        "basic_parameters": {
            "data_path": Key(str, True),     # JSONL, one record per line
            "data_folder": Key(str, default=""),  # image paths in records are relative to it
        },
        "preprocess_parameters": {
            "image_size": Key(int, True),
            "mean": Key("floats3", default=CLIP_MEAN), "std": Key("floats3", default=CLIP_STD),
            "interpolation": Key(str, default="bicubic", choices=("bicubic", "bilinear", "nearest")),
        },
    },
    "dataloader_param": {
        "shuffle": Key(bool, default=True),  # a new order each epoch (seeded by --seed)
        "num_workers": Key(int),             # sets --num-workers unless that is given
    },
}


@dataclass
class MMDataConfig:
    file: str
    data_path: str
    data_folder: str
    image_size: int
    mean: tuple
    std: tuple
    interpolation: str
    shuffle: bool
    num_workers: int | None


def load_data_config(path) -> MMDataConfig:
    raw, file = read_json(path)
    cfg = check_section(raw, DATA, "", str(path))
    basic = cfg["dataset_param"]["basic_parameters"]
    pre = cfg["dataset_param"]["preprocess_parameters"]
    loader = cfg["dataloader_param"]
    if any(s <= 0 for s in pre["std"]):
        raise MMConfigError(f"{path}: dataset_param.preprocess_parameters.std: must be positive, got {list(pre['std'])}")
    if pre["image_size"] <= 0:
        raise MMConfigError(f"{path}: dataset_param.preprocess_parameters.image_size: must be positive")
    if loader["num_workers"] is not None and loader["num_workers"] < 0:
        raise MMConfigError(f"{path}: dataloader_param.num_workers: must be >= 0")
    return MMDataConfig(
        file=str(path), data_path=resolve(file, basic["data_path"]), data_folder=resolve(file, basic["data_folder"]),
        image_size=pre["image_size"], mean=pre["mean"], std=pre["std"], interpolation=pre["interpolation"],
        shuffle=loader["shuffle"], num_workers=loader["num_workers"])


@functools.lru_cache(maxsize=None)
def cached_model_config(path: str, hf_load_dir: str | None = None) -> MMModelConfig:
    """model.json read once per process (argument checks and the model provider share it)."""
    return load_model_config(path, hf_load_dir)


def run_model_config(args) -> MMModelConfig:
    """model.json as this run reads it: ``--mm-model``, with ``--hf-load-dir`` where the file names no
    Hugging Face directory."""
    return cached_model_config(args.mm_model, getattr(args, "hf_load_dir", None))


@functools.lru_cache(maxsize=None)
def cached_data_config(path: str) -> MMDataConfig:
    return load_data_config(path)


def image_seq_len(vision: dict) -> int:
    """Embeddings one image gives the language model (patches, plus CLIP's class token if kept)."""
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    return patches + (1 if vision["model_id"] == "clip" and not vision["drop_class_token"] else 0)
