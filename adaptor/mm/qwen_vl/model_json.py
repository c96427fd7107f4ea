"""model.json of Qwen2.5-VL (``model_id: qwen2_5vl``) and Qwen3-VL (``qwen3vl``), MindSpeed-MM's shape.

::

    {"model_id": "qwen2_5vl", "img_context_token_id": 151655, "init_from_hf_path": "Qwen2.5-VL-3B-Instruct",
     "image_encoder": {"vision_encoder": {"model_id": "qwen2vit", "num_layers": 32, ...},
                       "vision_projector": {"model_id": "lnmlp", "freeze": true}},
     "text_decoder": {"model_id": "qwen2_5_lm", "num_layers": 36, "mrope_section": [16, 24, 24], ...}}

The model is described once, as a Hugging Face config dict (:attr:`MMModelConfig.hf_config`), from which
:class:`~adaptor.mm.qwen_vl.settings.VisionSettings` and :class:`~adaptor.mm.qwen_vl.text_config.VlTextConfig`
are read as for a checkpoint. With ``init_from_hf_path`` that dict is the directory's config.json and the
shape keys may be left out; each one given must agree with it. Without it, the shape keys build the dict.
Keys whose value the architecture fixes (``normalization``, ``activation_func`` of the decoder, ...) are
accepted only with that value, so a file written for another model fails in one line instead of
training something else. Keys not built here are refused by the schema, naming their JSON path.

MindSpeed-MM's published Qwen3-VL files write ``999999`` (:data:`FROM_HF`) for shape keys they leave to
config.json (``num_layers``, ``hidden_size``, ``num_attention_heads``, ``max_position_embeddings``).
With ``init_from_hf_path`` such a key is read as absent, so config.json's value is used, and its path is
recorded in :attr:`MMModelConfig.taken_from_hf`; without it there is nothing to take the value from.
Their ``patch`` section (``clip_grad_async``, ``scale_grad``) is read by :mod:`adaptor.mm.patch_section`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from adaptor.mm.patch_section import read_patch_section
from adaptor.mm.schema import Key, MMConfigError, MMModelConfig, check_section, resolve

FAMILY = {"qwen2_5vl": "qwen2_5_vl", "qwen3vl": "qwen3_vl", "qwen3_vl": "qwen3_vl"}
VISION_IDS = {"qwen2_5_vl": ("qwen2vit",), "qwen3_vl": ("qwen3vit",)}
TEXT_IDS = {"qwen2_5_vl": ("qwen2_5_lm", "qwen2lm"), "qwen3_vl": ("qwen3lm",)}
# model.json activation names -> the vision_config's hidden_act
VISION_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh",
                      "gelu_pytorch_tanh": "gelu_pytorch_tanh"}

# vision_encoder key -> VisionSettings field (also the Hugging Face vision_config key)
VISION_SHAPE = {
    "num_layers": "depth", "hidden_size": "hidden_size", "ffn_hidden_size": "intermediate_size",
    "intermediate_size": "intermediate_size", "num_attention_heads": "num_heads", "patch_size": "patch_size",
    "spatial_merge_size": "spatial_merge_size", "temporal_patch_size": "temporal_patch_size",
    "in_channels": "in_channels", "window_size": "window_size", "window_attn_size": "window_size",
    "fullatt_block_indexes": "fullatt_block_indexes", "num_position_embeddings": "num_position_embeddings",
    "deepstack_visual_indexes": "deepstack_visual_indexes", "activation_func": "hidden_act",
}
VISION_ENCODER = {
    "model_id": Key(str, True),
    **{k: Key(int) for k in ("num_layers", "hidden_size", "ffn_hidden_size", "intermediate_size",
                             "num_attention_heads", "patch_size", "spatial_merge_size", "temporal_patch_size",
                             "in_channels", "window_size", "window_attn_size", "num_position_embeddings")},
    "fullatt_block_indexes": Key("ints"), "deepstack_visual_indexes": Key("ints"),
    "activation_func": Key(str, choices=tuple(VISION_ACTIVATIONS)),
    "tokens_per_second": Key(float),  # the data pipeline's (video positions); checked against config.json
    # fixed by the family, accepted with that value only
    "normalization": Key(str), "gated_linear_unit": Key(bool), "layernorm_epsilon": Key(float),
    "hidden_dropout": Key(float), "attention_dropout": Key(float),
    "freeze": Key(bool, default=False),
}
VISION_PROJECTOR = {
    "model_id": Key(str, default="lnmlp", choices=("lnmlp",)),
    # the merger's widths and math are the tower's: accepted when they say what it computes
    "num_layers": Key(int), "input_size": Key(int), "hidden_size": Key(int), "ffn_hidden_size": Key(int),
    "activation_func": Key(str), "normalization": Key(str), "layernorm_epsilon": Key(float),
    "add_bias_linear": Key(bool), "gated_linear_unit": Key(bool), "bias_activation_fusion": Key(bool),
    "freeze": Key(bool, default=False),
}
# text_decoder key -> VlTextConfig field
TEXT_SHAPE = {
    "num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
    "num_attention_heads": "num_heads", "num_query_groups": "num_query_groups", "kv_channels": "head_dim",
    "vocab_size": "vocab_size", "layernorm_epsilon": "norm_epsilon", "rope_theta": "rope_theta",
    "mrope_section": "mrope_section",
}
TEXT_DECODER = {
    "model_id": Key(str, True),
    **{k: Key(int) for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                             "num_query_groups", "kv_channels", "vocab_size", "max_position_embeddings")},
    "layernorm_epsilon": Key(float), "rope_theta": Key(float), "mrope_section": Key("ints"),
    "rope_scaling": Key("object"),  # null, or {"type"/"rope_type": "mrope"|"default", "mrope_section": [...]}
    "untie_embeddings_and_output_weights": Key(bool), "group_query_attention": Key(bool),
    "hidden_dropout": Key(float), "attention_dropout": Key(float), "init_method_std": Key(float),
    # fixed by the family, accepted with that value only
    "normalization": Key(str), "activation_func": Key(str), "gated_linear_unit": Key(bool),
    "add_bias_linear": Key(bool), "disable_bias_linear": Key(bool), "add_qkv_bias": Key(bool),
    "qk_layernorm": Key(bool), "position_embedding_type": Key(str),
    "freeze": Key(bool, default=False),
}
MODEL = {
    "model_id": Key(str, True, choices=tuple(FAMILY)),
    "init_from_hf_path": Key(str),
    "img_context_token_id": Key(int), "video_token_id": Key(int), "vision_start_token_id": Key(int),
    "image_encoder": {"vision_encoder": VISION_ENCODER, "vision_projector": VISION_PROJECTOR},
    "text_decoder": TEXT_DECODER,
    "text_encoder": Key(None), "video_encoder": Key(None),
    "patch": Key("object"),  # MindSpeed-MM's patch switches: adaptor.mm.patch_section
}

FROM_HF = 999999  # "take this key from init_from_hf_path's config.json"

PREFIX = {"vision": "image_encoder.vision_encoder", "projector": "image_encoder.vision_projector",
          "text": "text_decoder", "": ""}


def _fixed(family: str) -> dict:
    """Per section, the keys whose value the architecture decides."""
    qwen25 = family == "qwen2_5_vl"
    norm = "RMSNorm" if qwen25 else "LayerNorm"
    return {
        "vision": {"normalization": norm, "gated_linear_unit": qwen25, "layernorm_epsilon": 1e-6,
                   "hidden_dropout": 0.0, "attention_dropout": 0.0},
        "projector": {"num_layers": 1, "activation_func": "gelu", "normalization": norm, "layernorm_epsilon": 1e-6,
                      "add_bias_linear": True, "gated_linear_unit": False, "bias_activation_fusion": False},
        "text": {"normalization": "RMSNorm", "activation_func": "silu", "gated_linear_unit": True,
                 "add_bias_linear": False, "disable_bias_linear": True, "add_qkv_bias": qwen25,
                 "qk_layernorm": not qwen25, "position_embedding_type": "mrope"},
    }


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return (tuple(a) if isinstance(a, (list, tuple)) else a) == (tuple(b) if isinstance(b, (list, tuple)) else b)


class _Where:
    def __init__(self, file: str):
        self.file = file

    def __call__(self, section: str, key: str) -> str:
        path = f"{PREFIX[section]}.{key}" if PREFIX[section] else key
        return f"{self.file}: {path}"


def _mrope_from_rope_scaling(rope_scaling: dict | None, where) -> tuple | None:
    if rope_scaling is None:
        return None
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    unknown = sorted(set(rope_scaling) - {"type", "rope_type", "mrope_section"})
    if kind not in ("mrope", "default") or unknown:
        raise MMConfigError(f"{where('text', 'rope_scaling')}: only the plain M-RoPE is built "
                            f"({{\"type\": \"mrope\", \"mrope_section\": [...]}}), got {json.dumps(rope_scaling)}")
    section = rope_scaling.get("mrope_section")
    return None if section is None else tuple(section)


def _drop_placeholders(cfg: dict, where, has_hf_dir: bool) -> tuple[str, ...]:
    """Set every :data:`FROM_HF` value to None (config.json decides it); the JSON paths that held one."""
    sections = {"": cfg, "vision": cfg["image_encoder"]["vision_encoder"],
                "projector": cfg["image_encoder"]["vision_projector"], "text": cfg["text_decoder"]}
    taken = []
    for section, keys in sections.items():
        for key, value in keys.items():
            if value == FROM_HF and not isinstance(value, bool):
                if not has_hf_dir:
                    raise MMConfigError(f"{where(section, key)} is {FROM_HF}, which means \"take it from "
                                        f"init_from_hf_path's config.json\", but no init_from_hf_path is given")
                keys[key] = None
                taken.append(f"{PREFIX[section]}.{key}" if PREFIX[section] else key)
    return tuple(taken)


def _config_from_keys(family: str, cfg: dict, where) -> dict:
    """A Hugging Face config dict made of the shape keys model.json gives."""
    vision, text = cfg["image_encoder"]["vision_encoder"], cfg["text_decoder"]
    needed = [("vision", k) for k in ("num_layers", "hidden_size", "num_attention_heads") if vision[k] is None]
    if vision["ffn_hidden_size"] is None and vision["intermediate_size"] is None:
        needed.append(("vision", "ffn_hidden_size"))
    if family == "qwen3_vl" and vision["num_position_embeddings"] is None:
        needed.append(("vision", "num_position_embeddings"))
    needed += [("text", k) for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                     "vocab_size") if text[k] is None]
    if cfg["img_context_token_id"] is None:
        needed.append(("", "img_context_token_id"))
    if needed:
        raise MMConfigError(f"{where(*needed[0])}: missing (needed without init_from_hf_path)")
    vision_config = {VISION_SHAPE[k]: list(v) if isinstance(v, tuple) else v for k, v in vision.items()
                     if k in VISION_SHAPE and v is not None}
    if "hidden_act" in vision_config:
        vision_config["hidden_act"] = VISION_ACTIVATIONS[vision_config["hidden_act"]]
    else:
        vision_config["hidden_act"] = "silu" if family == "qwen2_5_vl" else "gelu_pytorch_tanh"
    if family == "qwen3_vl":
        vision_config.setdefault("patch_size", 16)
    vision_config["out_hidden_size"] = text["hidden_size"]
    if vision["tokens_per_second"] is not None:
        vision_config["tokens_per_second"] = vision["tokens_per_second"]
    rope = {"rope_type": "default", "rope_theta": text["rope_theta"] or 1000000.0}
    section = text["mrope_section"] or _mrope_from_rope_scaling(text["rope_scaling"], where)
    if section is not None:
        rope["mrope_section"] = list(section)
    text_config = {"hidden_size": text["hidden_size"], "intermediate_size": text["ffn_hidden_size"],
                   "num_hidden_layers": text["num_layers"], "num_attention_heads": text["num_attention_heads"],
                   "num_key_value_heads": text["num_query_groups"] or text["num_attention_heads"],
                   "vocab_size": text["vocab_size"], "rms_norm_eps": text["layernorm_epsilon"] or 1e-6,
                   "max_position_embeddings": text["max_position_embeddings"] or 128000, "rope_parameters": rope}
    if text["kv_channels"] is not None:
        text_config["head_dim"] = text["kv_channels"]
    return {"model_type": family, "vision_config": vision_config, "text_config": text_config,
            "image_token_id": cfg["img_context_token_id"], "video_token_id": cfg["video_token_id"],
            "vision_start_token_id": cfg["vision_start_token_id"],
            "tie_word_embeddings": not bool(text["untie_embeddings_and_output_weights"])}


def _config_from_directory(family: str, directory: str, label: str) -> dict:
    """``directory``'s config.json; ``label`` names where the directory was given, for the one error line."""
    file = Path(directory) / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MMConfigError(f"{label}: cannot read {file} ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise MMConfigError(f"{label}: {file} is not valid JSON ({exc.msg})") from None
    if config.get("model_type") != family:
        raise MMConfigError(f"{label}: {file} has model_type "
                            f"{config.get('model_type')!r}; this model.json builds {family}")
    return config


def _hf_directory(json_dir: str | None, flag_dir: str | None, path: str) -> tuple[str | None, str]:
    """The Hugging Face directory that describes and starts the model, and where it was named.

    ``--hf-load-dir`` stands in for a missing ``init_from_hf_path``; both may be given only when they name
    the same directory, since each would otherwise describe a different model.
    """
    if flag_dir is None:
        return json_dir, "init_from_hf_path"
    if json_dir is not None and Path(json_dir).resolve() != Path(flag_dir).resolve():
        raise MMConfigError(f"{path}: init_from_hf_path {json_dir} and --hf-load-dir {flag_dir} name different "
                            f"directories; give one")
    return (json_dir, "init_from_hf_path") if json_dir is not None else (flag_dir, "--hf-load-dir")


def _check_given(family: str, cfg: dict, hf_config: dict, settings, text_cfg, where, source: str) -> None:
    """Every shape key model.json gives says what ``hf_config`` says."""
    vision, text = cfg["image_encoder"]["vision_encoder"], cfg["text_decoder"]
    checks = []
    for key, field in VISION_SHAPE.items():
        value = vision[key]
        if value is not None:
            value = VISION_ACTIVATIONS[value] if key == "activation_func" else value
            checks.append(("vision", key, value, getattr(settings, field)))
    if vision["tokens_per_second"] is not None:
        checks.append(("vision", "tokens_per_second", vision["tokens_per_second"],
                       hf_config["vision_config"].get("tokens_per_second", 2)))
    for key, field in TEXT_SHAPE.items():
        if text[key] is not None:
            checks.append(("text", key, text[key], getattr(text_cfg, field)))
    section = _mrope_from_rope_scaling(text["rope_scaling"], where)
    if section is not None:
        checks.append(("text", "rope_scaling", list(section), list(text_cfg.mrope_section)))
    if text["untie_embeddings_and_output_weights"] is not None:
        checks.append(("text", "untie_embeddings_and_output_weights", text["untie_embeddings_and_output_weights"],
                       not text_cfg.tied))
    if text["group_query_attention"] is not None:
        checks.append(("text", "group_query_attention", text["group_query_attention"],
                       text_cfg.num_query_groups != text_cfg.num_heads))
    merged = settings.merge_unit * settings.hidden_size
    projector = cfg["image_encoder"]["vision_projector"]
    for key, want in (("input_size", settings.hidden_size), ("ffn_hidden_size", merged),
                      ("hidden_size", text_cfg.hidden_size)):
        if projector[key] is not None:
            checks.append(("projector", key, projector[key], want))
    for key, want in (("img_context_token_id", hf_config.get("image_token_id")),
                      ("video_token_id", hf_config.get("video_token_id")),
                      ("vision_start_token_id", hf_config.get("vision_start_token_id"))):
        if cfg[key] is not None and want is not None:
            checks.append(("", key, cfg[key], want))
    for section, key, mine, theirs in checks:
        if not _same(mine, theirs):
            raise MMConfigError(f"{where(section, key)} is {json.dumps(mine)} but {source} says "
                                f"{json.dumps(list(theirs) if isinstance(theirs, tuple) else theirs)}")


def load_qwen_vl_model_config(raw: dict, file: Path, path: str, hf_load_dir: str | None = None) -> MMModelConfig:
    """A checked Qwen-VL model.json; :attr:`MMModelConfig.text` holds the decoder's Megatron arguments.

    ``hf_load_dir`` (the command line's ``--hf-load-dir``) is read as ``init_from_hf_path`` when the file
    has none.
    """
    from adaptor.mm.qwen_vl.settings import VisionSettings
    from adaptor.mm.qwen_vl.text_config import vl_text_config

    cfg = check_section(raw, MODEL, "", path)
    patch_notices = read_patch_section(cfg["patch"], path)
    where = _Where(path)
    family = FAMILY[cfg["model_id"]]
    init_dir, dir_source = _hf_directory(resolve(file, cfg["init_from_hf_path"]), hf_load_dir, path)
    taken = _drop_placeholders(cfg, where, init_dir is not None)
    vision, projector, text = cfg["image_encoder"]["vision_encoder"], cfg["image_encoder"]["vision_projector"], \
        cfg["text_decoder"]
    for section, keys, ids in (("vision", vision, VISION_IDS[family]), ("text", text, TEXT_IDS[family])):
        if keys["model_id"] not in ids:
            raise MMConfigError(f"{where(section, 'model_id')}: {json.dumps(keys['model_id'])} is not one of "
                                f"{', '.join(map(json.dumps, ids))} ({cfg['model_id']})")
    for section, fixed in _fixed(family).items():
        keys = {"vision": vision, "projector": projector, "text": text}[section]
        for key, want in fixed.items():
            if keys[key] is not None and not _same(keys[key], want):
                raise MMConfigError(f"{where(section, key)} is {json.dumps(keys[key])}; {cfg['model_id']} has "
                                    f"{json.dumps(want)} (not configurable)")
    if init_dir is not None:
        label = where("", "init_from_hf_path") if dir_source == "init_from_hf_path" else f"--hf-load-dir {init_dir}"
        hf_config = _config_from_directory(family, init_dir, label)
        source = f"{init_dir}/config.json"
    else:
        hf_config = _config_from_keys(family, cfg, where)
        source = "the model it builds"
    try:
        settings = VisionSettings.from_hf(family, hf_config["vision_config"])
        text_cfg = vl_text_config(hf_config)
    except (ValueError, TypeError) as exc:
        raise MMConfigError(f"{path}: {exc}") from None
    _check_given(family, cfg, hf_config, settings, text_cfg, where, source)
    if hf_config.get("image_token_id") is None:
        raise MMConfigError(f"{where('', 'img_context_token_id')}: missing ({source} names no image_token_id)")
    if settings.out_hidden_size != text_cfg.hidden_size:
        raise MMConfigError(f"{path}: the vision tower's out_hidden_size {settings.out_hidden_size} is not the text "
                            f"decoder's hidden_size {text_cfg.hidden_size}")
    if len(settings.deepstack_visual_indexes) > text_cfg.num_layers:
        raise MMConfigError(f"{where('vision', 'deepstack_visual_indexes')}: {len(settings.deepstack_visual_indexes)} "
                            f"deepstack features for {text_cfg.num_layers} decoder layers")
    if vision["freeze"] and projector["freeze"] and text["freeze"]:
        raise MMConfigError(f"{path}: every part is frozen (vision_encoder, vision_projector and text_decoder "
                            f"freeze: true); nothing would train")
    theta = text_cfg.rope_theta
    decoder_args = {
        "num_layers": text_cfg.num_layers, "hidden_size": text_cfg.hidden_size,
        "ffn_hidden_size": text_cfg.ffn_hidden_size, "num_attention_heads": text_cfg.num_heads,
        "num_query_groups": text_cfg.num_query_groups, "kv_channels": text_cfg.head_dim,
        "qk_layernorm": text_cfg.qk_norm, "normalization": "RMSNorm", "layernorm_epsilon": text_cfg.norm_epsilon,
        "add_bias_linear": False, "add_qkv_bias": text_cfg.qkv_bias, "position_embedding_type": "mrope",
        "rotary_base": int(theta) if float(theta).is_integer() else theta,
        "mrope_section": list(text_cfg.mrope_section),
        "max_position_embeddings": text["max_position_embeddings"] or int(
            {**hf_config, **(hf_config.get("text_config") or {})}.get("max_position_embeddings") or 128000),
        "untie_embeddings_and_output_weights": not text_cfg.tied, "swiglu": True,
        # The published models have no dropout; Megatron's default (0.1) would add it silently.
        "vocab_size": text_cfg.vocab_size, "hidden_dropout": text["hidden_dropout"] or 0.0,
        "attention_dropout": text["attention_dropout"] or 0.0, "init_method_std": text["init_method_std"],
        "freeze": text["freeze"], "ckpt_path": None,
    }
    return MMModelConfig(
        file=path, vision={"model_id": vision["model_id"], "freeze": vision["freeze"], "ckpt_path": None},
        projector={"model_id": projector["model_id"], "freeze": projector["freeze"]}, text=decoder_args,
        model_id=cfg["model_id"], hf_config=hf_config, init_from_hf_path=init_dir, hf_dir_source=dir_source,
        taken_from_hf=taken, patch_notices=patch_notices)


def vision_settings(model_cfg: MMModelConfig):
    from adaptor.mm.qwen_vl.settings import VisionSettings

    return VisionSettings.from_hf(model_cfg.hf_config["model_type"], model_cfg.hf_config["vision_config"])


def text_config(model_cfg: MMModelConfig):
    from adaptor.mm.qwen_vl.text_config import vl_text_config

    return vl_text_config(model_cfg.hf_config)
