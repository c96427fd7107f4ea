"""data.json for Qwen2.5-VL and Qwen3-VL: MindSpeed-MM's ``"dataset_type": "huggingface"`` file.

MindSpeed-MM hands this file to LLaMA-Factory's data pipeline, so its keys are LLaMA-Factory's::

    {"dataset_param": {
        "dataset_type": "huggingface",
        "preprocess_parameters": {"model_name_or_path": "Qwen2.5-VL-3B-Instruct",
                                  "image_max_pixels": 262144, "image_min_pixels": 0, ...},
        "basic_parameters": {"template": "qwen2vl", "dataset_dir": "./data",
                             "dataset": "./data/train.json", "cutoff_len": 2048, ...},
        "attr": {"images": "images", "messages": "messages", "role_tag": "role", "content_tag": "content",
                 "user_tag": "user", "assistant_tag": "assistant", ...}},
     "dataloader_param": {"shuffle": true, "num_workers": 2, ...}}

Every key a published MindSpeed-MM Qwen-VL data.json carries is accepted. Keys that only tune
LLaMA-Factory's offline preprocessing (cache, worker counts, batch size) have no effect here, since
samples are built on the fly; keys for what is not built (tools, observation turns, split special
tokens) are refused unless null or their inert value. Videos (``attr.videos``) are read with
``video_fps`` (frames per second of frame lists, and the sampling rate of video files),
``video_maxlen`` (frames at most from a file) and ``video_min_pixels`` / ``video_max_pixels`` (per frame). A ``null`` is the same as an absent key.
Problems are one :class:`~adaptor.mm.config.MMConfigError` line naming the file and JSON path.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from adaptor.mm.schema import Key, MMConfigError, check_section, read_json, resolve

# Templates: the chat format, and the family whose processor and positions it implies without model.json.
TEMPLATES = {"qwen2vl": "qwen2_5_vl", "qwen2_vl": "qwen2_5_vl", "qwen3_vl_nothink": "qwen3_vl"}

PREPROCESS = {
    "model_name_or_path": Key(str, True),  # tokenizer.json and preprocessor_config.json are read from it
    "use_fast_tokenizer": Key(bool, default=True, choices=(True,)),
    "split_special_tokens": Key(bool, default=False, choices=(False,)),
    "image_max_pixels": Key(int), "image_min_pixels": Key(int),
    "video_max_pixels": Key(int), "video_min_pixels": Key(int), "video_fps": Key(float), "video_maxlen": Key(int),
}

BASIC = {
    "template": Key(str, True, choices=tuple(TEMPLATES)),
    "dataset_dir": Key(str, default="."),  # image paths in records are relative to it
    "dataset": Key(str, True),             # a JSON list of records, or JSON Lines
    "cutoff_len": Key(int),                # tokens per sample at most (also capped by --seq-length)
    "train_on_prompt": Key(bool, default=False),
    "mask_history": Key(bool, default=False),  # loss on the last assistant turn only
    "max_samples": Key(int),               # the first N records only
    "enable_thinking": Key(bool, default=False, choices=(False,)),
    # LLaMA-Factory's offline preprocessing: no effect on samples built on the fly.
    "cache_dir": Key(str), "overwrite_cache": Key(bool), "preprocessing_batch_size": Key(int),
    "preprocessing_num_workers": Key(int),
    "tool_format": Key(None),
}

ATTR = {
    "formatting": Key(str, default="sharegpt", choices=("sharegpt",)),
    "system": Key(str),                    # a record key holding the system prompt
    "images": Key(str, default="images"),
    "messages": Key(str, default="conversations"),
    "role_tag": Key(str, default="from"), "content_tag": Key(str, default="value"),
    "user_tag": Key(str, default="human"), "assistant_tag": Key(str, default="gpt"),
    "system_tag": Key(str, default="system"),
    "videos": Key(str, default="videos"),
    "observation_tag": Key(None), "function_tag": Key(None),
}

LOADER = {
    "dataloader_mode": Key(str, default="sampler", choices=("sampler",)),
    "drop_last": Key(bool, default=True, choices=(True,)),  # Megatron's sampler keeps whole micro-batches
    "sampler_type": Key(str, choices=("BaseRandomBatchSampler",)),
    "collate_param": {"model_name": Key(str, choices=("qwen2vl", "qwen2_5vl", "qwen3vl")),
                      "ignore_pad_token_for_loss": Key(bool, default=True, choices=(True,))},
    "pin_memory": Key(bool, default=True),
    "shuffle": Key(bool, default=True),    # a new order each epoch (seeded by --seed)
    "num_workers": Key(int),               # sets --num-workers unless that is given
}

DATA = {
    "dataset_param": {"dataset_type": Key(str, True, choices=("huggingface",)),
                      "preprocess_parameters": PREPROCESS, "basic_parameters": BASIC, "attr": ATTR},
    "dataloader_param": LOADER,
}


@dataclass(frozen=True)
class QwenVLDataConfig:
    file: str
    model_name_or_path: str     # absolute
    template: str
    dataset: str                # absolute
    dataset_dir: str            # absolute
    image_min_pixels: int | None
    image_max_pixels: int | None
    video_min_pixels: int | None
    video_max_pixels: int | None
    video_fps: float | None
    video_maxlen: int | None
    cutoff_len: int | None
    train_on_prompt: bool
    mask_history: bool
    max_samples: int | None
    attr: dict
    shuffle: bool
    num_workers: int | None

    @property
    def family(self) -> str:
        """The processor family the template implies (model.json's model_id, when given, decides)."""
        return TEMPLATES[self.template]


def _without_nulls(obj):
    """JSON ``null`` read as an absent key, at every depth (LLaMA-Factory's meaning of null)."""
    if isinstance(obj, dict):
        return {k: _without_nulls(v) for k, v in obj.items() if v is not None}
    return obj


# Keys that must be present in the schema's nested sections; absent ones are filled with {}.
_OPTIONAL_SECTIONS = (("dataset_param", "attr"), ("dataloader_param",), ("dataloader_param", "collate_param"))


def is_qwen_vl_data_json(raw) -> bool:
    """Whether a parsed data.json is of this kind (MindSpeed-MM's ``huggingface`` dataset type)."""
    return isinstance(raw, dict) and isinstance(raw.get("dataset_param"), dict) and \
        raw["dataset_param"].get("dataset_type") == "huggingface"


def load_qwen_vl_data_config(path) -> QwenVLDataConfig:
    raw, file = read_json(path)
    raw = _without_nulls(raw)
    for section in _OPTIONAL_SECTIONS:
        parent = raw
        for name in section[:-1]:
            parent = parent.get(name, {}) if isinstance(parent, dict) else {}
        if isinstance(parent, dict):
            parent.setdefault(section[-1], {})
    cfg = check_section(raw, DATA, "", str(path))
    pre, basic = cfg["dataset_param"]["preprocess_parameters"], cfg["dataset_param"]["basic_parameters"]
    loader = cfg["dataloader_param"]
    where = f"{path}: dataset_param"
    for key in ("image_min_pixels", "image_max_pixels"):
        if pre[key] is not None and pre[key] < 0:
            raise MMConfigError(f"{where}.preprocess_parameters.{key}: must be >= 0, got {pre[key]}")
    if pre["image_max_pixels"] is not None and pre["image_max_pixels"] < max(1, pre["image_min_pixels"] or 0):
        raise MMConfigError(f"{where}.preprocess_parameters.image_max_pixels: {pre['image_max_pixels']} is below "
                            f"image_min_pixels {pre['image_min_pixels']} (or not positive)")
    for key in ("video_min_pixels", "video_max_pixels"):
        if pre[key] is not None and pre[key] < 0:
            raise MMConfigError(f"{where}.preprocess_parameters.{key}: must be >= 0, got {pre[key]}")
    for key in ("video_fps", "video_maxlen"):
        if pre[key] is not None and pre[key] <= 0:
            raise MMConfigError(f"{where}.preprocess_parameters.{key}: must be positive, got {pre[key]}")
    for key in ("cutoff_len", "max_samples"):
        if basic[key] is not None and basic[key] <= 0:
            raise MMConfigError(f"{where}.basic_parameters.{key}: must be positive, got {basic[key]}")
    if loader["num_workers"] is not None and loader["num_workers"] < 0:
        raise MMConfigError(f"{path}: dataloader_param.num_workers: must be >= 0")
    return QwenVLDataConfig(
        file=str(path), model_name_or_path=resolve(file, pre["model_name_or_path"]), template=basic["template"],
        dataset=resolve(file, basic["dataset"]), dataset_dir=resolve(file, basic["dataset_dir"]),
        image_min_pixels=pre["image_min_pixels"], image_max_pixels=pre["image_max_pixels"],
        video_min_pixels=pre["video_min_pixels"], video_max_pixels=pre["video_max_pixels"],
        video_fps=pre["video_fps"], video_maxlen=pre["video_maxlen"],
        cutoff_len=basic["cutoff_len"], train_on_prompt=basic["train_on_prompt"],
        mask_history=basic["mask_history"], max_samples=basic["max_samples"], attr=cfg["dataset_param"]["attr"],
        shuffle=loader["shuffle"], num_workers=loader["num_workers"])


@functools.lru_cache(maxsize=None)
def cached_qwen_vl_data_config(path: str) -> QwenVLDataConfig:
    return load_qwen_vl_data_config(path)


def check_paths(cfg: QwenVLDataConfig) -> None:
    """The files data.json names exist (before training starts, not at the first sample)."""
    import os

    section = f"{cfg.file}: dataset_param"
    if not os.path.isfile(os.path.join(cfg.model_name_or_path, "tokenizer.json")):
        raise MMConfigError(f"{section}.preprocess_parameters.model_name_or_path: no tokenizer.json in "
                            f"{cfg.model_name_or_path}")
    if not os.path.isfile(cfg.dataset):
        raise MMConfigError(f"{section}.basic_parameters.dataset: no such file {cfg.dataset}")
    if not os.path.isdir(cfg.dataset_dir):
        raise MMConfigError(f"{section}.basic_parameters.dataset_dir: no such directory {cfg.dataset_dir}")


def load_mm_data_config(path):
    """data.json of either kind: this module's for ``dataset_type: huggingface``, else
    :func:`adaptor.mm.config.load_data_config` (the LLaVA JSONL records)."""
    from adaptor.mm.config import load_data_config

    raw, _ = read_json(path)
    return load_qwen_vl_data_config(path) if is_qwen_vl_data_json(raw) else load_data_config(path)


@functools.lru_cache(maxsize=None)
def cached_mm_data_config(path: str):
    """:func:`load_mm_data_config` read once per process (argument checks and the dataset provider share it)."""
    return load_mm_data_config(path)
