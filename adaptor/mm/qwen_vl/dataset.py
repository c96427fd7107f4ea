"""Qwen2.5-VL / Qwen3-VL training data for pretrain_mm.py: data.json in, micro-batches out.

A micro-batch (what the model side reads)::

    tokens        int64   [b, s]
    labels        int64   [b, s]       tokens shifted by one (Megatron's convention)
    loss_mask     float32 [b, s]       1 on what the assistant says, 0 on prompt, images and padding
    position_ids  int64   [3, b, s]    the family's 3-D rotary positions; 0 on padding
    pixel_values  float32 [N, C*T*P*P] the patches of all images of the micro-batch, sample by sample
    image_grid_thw int64  [n, 3]       one row per image, same order
    pixel_values_videos, video_grid_thw  the same for the videos (zero rows without videos)

Samples differ in length and image count, so Megatron's default collate cannot batch them: :func:`collate`
pads to the longest sample (right padding; causal attention never lets a real token see it) and
concatenates the images and the videos. :func:`build_train_loader` puts it behind Megatron's own sampler (so resuming
skips consumed samples as usual) and returns an iterator, for ``args.dataloader_type = "external"``.
With pipeline parallelism (stages exchange fixed-shape activations) and without
``--variable-seq-lengths``, every micro-batch is padded to ``--seq-length`` instead.
"""
from __future__ import annotations

import functools
import math

import torch

from adaptor.mm.schema import MMConfigError
from adaptor.mm.data import RecordSamples
from adaptor.mm.qwen_vl.data_config import QwenVLDataConfig, load_qwen_vl_data_config
from adaptor.mm.qwen_vl.model_json import FAMILY
from adaptor.mm.qwen_vl.records import read_vl_records
from adaptor.mm.qwen_vl.samples import SampleBuilder, VideoOptions, load_tokenizer, processor_settings
from adaptor.mm.qwen_vl.video_processor import video_settings

# model.json's model_id (MindSpeed-MM's files spell Qwen3-VL's both qwen3vl and qwen3_vl) -> the processor /
# rotary family.
MODEL_FAMILIES = FAMILY


def family_of(model_cfg, data_cfg: QwenVLDataConfig) -> str:
    """model.json's ``model_id`` decides the family; without one (or no model config), data.json's template."""
    model_id = model_cfg.get("model_id") if isinstance(model_cfg, dict) else getattr(model_cfg, "model_id", None)
    if model_id is None:
        return data_cfg.family
    if model_id not in MODEL_FAMILIES:
        raise MMConfigError(f"{data_cfg.file}: a huggingface dataset feeds model_id {' or '.join(MODEL_FAMILIES)}, "
                            f"not {model_id!r}")
    return MODEL_FAMILIES[model_id]


def _tokens_per_second(model_cfg) -> float:
    """The model's temporal positions per second of video (its vision_config; 2 as published)."""
    hf_config = getattr(model_cfg, "hf_config", None) or {}
    return float((hf_config.get("vision_config") or {}).get("tokens_per_second", 2))


class QwenVLDataset(RecordSamples):
    """Qwen-VL samples of :class:`SampleBuilder`, drawn as :class:`~adaptor.mm.data.RecordSamples` draws."""

    def __init__(self, records, builder: SampleBuilder, num_samples: int, shuffle: bool, seed: int, skip_bad: bool,
                 source: str = "the dataset"):
        super().__init__(records, num_samples, shuffle, seed, skip_bad, source)
        self.builder = builder
        self.pad_id = builder.pad_id  # what collate pads tokens and labels with

    def make(self, record) -> dict:
        return self.builder.build(record)


def build_train_dataset(args, data_cfg, model_cfg, num_samples: int) -> QwenVLDataset:
    """The training dataset of a ``huggingface`` data.json (a :class:`QwenVLDataConfig` or its path).

    ``args``: ``seq_length``, ``seed`` and ``mm_skip_bad_records`` are read. ``model_cfg``: model.json's
    parsed dict or config object, for its ``model_id`` (or None).
    """
    if not isinstance(data_cfg, QwenVLDataConfig):
        data_cfg = load_qwen_vl_data_config(data_cfg)
    family = family_of(model_cfg, data_cfg)
    where = f"{data_cfg.file}: dataset_param.preprocess_parameters.model_name_or_path"
    tokenizer, pad_id, image_pad_id = load_tokenizer(data_cfg.model_name_or_path, where)
    try:
        settings = processor_settings(family, data_cfg.model_name_or_path, data_cfg.image_min_pixels,
                                      data_cfg.image_max_pixels)
        video = VideoOptions(video_settings(settings, data_cfg.video_min_pixels, data_cfg.video_max_pixels),
                             data_cfg.video_fps, data_cfg.video_maxlen, _tokens_per_second(model_cfg))
    except ValueError as exc:
        raise MMConfigError(f"{data_cfg.file}: dataset_param.preprocess_parameters: {exc}") from None
    max_ids, limit_text = args.seq_length + 1, f"--seq-length {args.seq_length}"
    if data_cfg.cutoff_len is not None and data_cfg.cutoff_len < max_ids:
        max_ids, limit_text = data_cfg.cutoff_len, f"cutoff_len {data_cfg.cutoff_len}"
    if max_ids < 2:
        raise MMConfigError(f"{data_cfg.file}: dataset_param.basic_parameters.cutoff_len: must be at least 2")
    skip_bad = bool(getattr(args, "mm_skip_bad_records", False))
    records, skipped = read_vl_records(data_cfg, skip_bad)
    if skipped:
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
        print(f"> {data_cfg.dataset}: {len(records)} records used, {sum(skipped.values())} skipped ({reasons}) "
              f"under --mm-skip-bad-records", flush=True)
    builder = SampleBuilder(tokenizer, pad_id, image_pad_id, settings, family, data_cfg.template, max_ids,
                            limit_text, data_cfg.train_on_prompt, data_cfg.mask_history, video)
    return QwenVLDataset(records, builder, num_samples, data_cfg.shuffle, args.seed, skip_bad, data_cfg.dataset)


def collate(samples: list[dict], pad_id: int = 0, length: int | None = None, multiple: int = 1) -> dict:
    """Samples to one micro-batch: padded on the right to the longest sample (or ``length``), rounded up to
    ``multiple``; images concatenated in sample order."""
    longest = max(len(s["tokens"]) for s in samples)
    size = length if length is not None else longest
    size = math.ceil(size / multiple) * multiple
    if longest > size:
        raise ValueError(f"a sample of {longest} tokens does not fit the padded length {size}")
    batch = len(samples)
    tokens = torch.full((batch, size), pad_id, dtype=torch.long)
    labels = torch.full((batch, size), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(batch, size, dtype=torch.float32)
    position_ids = torch.zeros(3, batch, size, dtype=torch.long)
    for row, sample in enumerate(samples):
        n = len(sample["tokens"])
        tokens[row, :n], labels[row, :n] = sample["tokens"], sample["labels"]
        loss_mask[row, :n] = sample["loss_mask"]
        position_ids[:, row, :n] = sample["position_ids"]
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids,
            **{key: torch.cat([s[key] for s in samples])
               for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")}}


def batch_shape_for(args) -> tuple[int | None, int]:
    """(fixed length or None, multiple) the parallel layout asks of a micro-batch's sequence length:
    fixed under pipeline parallelism unless --variable-seq-lengths; a multiple of the TP size under
    sequence parallelism and of twice the CP size under context parallelism (both split the sequence)."""
    fixed = None
    if getattr(args, "pipeline_model_parallel_size", 1) > 1 and not getattr(args, "variable_seq_lengths", False):
        fixed = args.seq_length
    multiple = 1
    if getattr(args, "sequence_parallel", False):
        multiple *= args.tensor_model_parallel_size
    if getattr(args, "context_parallel_size", 1) > 1:
        multiple *= 2 * args.context_parallel_size
    return fixed, multiple


def data_loader(dataset: QwenVLDataset, batch_sampler, args):
    """A DataLoader of micro-batches (index lists from ``batch_sampler``) collated for ``args``' layout."""
    length, multiple = batch_shape_for(args)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=batch_sampler, num_workers=args.num_workers, pin_memory=torch.cuda.is_available(),
        persistent_workers=args.num_workers > 0,
        collate_fn=functools.partial(collate, pad_id=dataset.pad_id, length=length, multiple=multiple))


def build_train_loader(dataset: QwenVLDataset, args, consumed_samples: int):
    """An iterator of micro-batches for this data-parallel rank, behind Megatron's pretraining sampler
    (so that resuming skips the consumed samples as usual).

    Hand it to Megatron with ``args.dataloader_type = "external"`` (Megatron then iterates it as given)."""
    from megatron.core import mpu
    from megatron.training.datasets.data_samplers import MegatronPretrainingSampler

    sampler = MegatronPretrainingSampler(
        total_samples=len(dataset), consumed_samples=consumed_samples, micro_batch_size=args.micro_batch_size,
        data_parallel_rank=mpu.get_data_parallel_rank(), data_parallel_size=mpu.get_data_parallel_world_size())
    return iter(data_loader(dataset, sampler, args))


def build_train_iterator(args, data_cfg, model_cfg, num_samples: int):
    """What pretrain_mm.py's dataset provider returns for a ``huggingface`` data.json: the micro-batch
    iterator from ``args.consumed_train_samples`` on (Megatron sets it before calling the provider when
    resuming); switches ``args.dataloader_type`` to ``"external"`` so that Megatron iterates it as given."""
    dataset = build_train_dataset(args, data_cfg, model_cfg, num_samples)
    args.dataloader_type = "external"
    return build_train_loader(dataset, args, args.consumed_train_samples)
