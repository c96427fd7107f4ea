"""pretrain_mm.py's steps for Qwen2.5-VL and Qwen3-VL (model.json ``model_id: qwen2_5vl`` / ``qwen3vl``).

A micro-batch from the data pipeline holds ``tokens``, ``labels`` [b, s] (int64), ``loss_mask`` [b, s]
(float32), ``position_ids`` [3, b, s] (int64, the 3-D rotary positions, so every pipeline stage has them),
``pixel_values`` [patches, C*T*P*P] (float32, the micro-batch's images in order) and ``image_grid_thw``
[images, 3] (int64), and the same two for its videos (``pixel_values_videos``, ``video_grid_thw``). TP rank
0 reads it; :func:`broadcast_batch` sends it over the TP group, sizes first, since the number of patches
changes from one micro-batch to the next (and may be zero).
"""
from __future__ import annotations

from functools import partial

import torch

TEXT_INT_KEYS = ("tokens", "labels", "position_ids")
VISION_KEYS = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def _broadcast_vision(batch: dict | None, pixels_key: str, grid_key: str, device, group, source) -> dict:
    """One (patches, grids) pair of ``batch`` over the TP group: their sizes, then (if any) their values."""
    first = batch is not None
    present = first and pixels_key in batch
    sizes = [*batch[pixels_key].shape, batch[grid_key].shape[0]] if present else [0, 0, 0]
    sizes = torch.tensor(sizes, dtype=torch.int64, device=device)
    torch.distributed.broadcast(sizes, source, group=group)
    patches, width, items = sizes.tolist()
    if present:
        pixels = batch[pixels_key].to(device, torch.float32).contiguous()
        grid = batch[grid_key].to(device, torch.int64).contiguous()
    else:
        pixels = torch.empty(patches, width, dtype=torch.float32, device=device)
        grid = torch.empty(items, 3, dtype=torch.int64, device=device)
    if items:
        torch.distributed.broadcast(pixels, source, group=group)
        torch.distributed.broadcast(grid, source, group=group)
    return {pixels_key: pixels, grid_key: grid}


def broadcast_batch(batch: dict | None) -> dict:
    """``batch`` (TP rank 0; None elsewhere) on every rank of the TP group.

    megatron's ``broadcast_data`` reads a tensor's shape up to its first zero, so the image and video
    tensors, which are empty in a micro-batch without them, go separately: their sizes, then their values.
    """
    from megatron.core import mpu, tensor_parallel

    out = {**tensor_parallel.broadcast_data(list(TEXT_INT_KEYS), batch, torch.int64),
           **tensor_parallel.broadcast_data(["loss_mask"], batch, torch.float32)}
    device = out["tokens"].device
    group = mpu.get_tensor_model_parallel_group()
    source = torch.distributed.get_process_group_ranks(group)[0]
    for pixels_key, grid_key in VISION_KEYS:
        out.update(_broadcast_vision(batch, pixels_key, grid_key, device, group, source))
    return out


def get_batch(data_iterator) -> dict:
    from megatron.core import mpu

    return broadcast_batch(next(data_iterator) if mpu.get_tensor_model_parallel_rank() == 0 else None)


def forward_step(data_iterator, model):
    from megatron.training import get_timers

    from adaptor.lm_loss import masked_lm_loss

    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    batch = get_batch(data_iterator)
    timers("batch-generator").stop()
    output = model(batch["tokens"], batch["position_ids"], batch["pixel_values"], batch["image_grid_thw"],
                   labels=batch["labels"], loss_mask=batch["loss_mask"],
                   pixel_values_videos=batch["pixel_values_videos"], video_grid_thw=batch["video_grid_thw"])
    return output, partial(masked_lm_loss, batch["loss_mask"])


def train_dataset(args, data_cfg, model_cfg, num_samples):
    """The micro-batch iterator of a ``huggingface`` data.json (Megatron iterates it as given)."""
    from adaptor.mm.qwen_vl.dataset import build_train_iterator

    return build_train_iterator(args, data_cfg, model_cfg, num_samples)


def hf_weights_to_load(model_cfg, load: str | None, resuming: bool) -> str | None:
    """The Hugging Face directory whose tensors start this run, or None.

    model.json's ``init_from_hf_path`` is always read (Megatron's ``--load`` then overwrites it, as in
    MindSpeed-MM); ``--hf-load-dir`` steps aside when ``--load`` holds a checkpoint (``resuming``), as it
    does for GPT models (patches/hf/online_conversion.py): the run resumes from that checkpoint.
    """
    path = model_cfg.init_from_hf_path
    if path is not None and model_cfg.hf_dir_source == "--hf-load-dir" and resuming:
        from adaptor.log import notice

        notice(f"--load {load} has a checkpoint: resuming from it, not from --hf-load-dir")
        return None
    return path


def load_initial_weights(model, model_cfg, args) -> None:
    """model.json's ``init_from_hf_path`` (or ``--hf-load-dir``): this rank's tensors of that directory, split
    for the run's TP/PP."""
    from megatron.core import mpu
    from megatron.training.checkpointing import checkpoint_exists

    from adaptor.convert import ConversionError, HfCheckpoint, Layout
    from adaptor.errors import fail
    from adaptor.log import notice
    from adaptor.mm.qwen_vl.checkpoint import load_hf_into

    path = hf_weights_to_load(model_cfg, args.load, checkpoint_exists(args.load))
    if path is None:
        return
    try:
        count = load_hf_into(model, HfCheckpoint(path), Layout(tp=args.tensor_model_parallel_size,
                                                               pp=args.pipeline_model_parallel_size),
                             mpu.get_tensor_model_parallel_rank(), mpu.get_pipeline_model_parallel_rank())
    except (ConversionError, ValueError, KeyError, OSError) as exc:
        where = f"{model_cfg.file}: init_from_hf_path" if model_cfg.hf_dir_source == "init_from_hf_path" \
            else "--hf-load-dir"
        fail(f"{where} {path}: {exc}")
    notice(f"Qwen-VL model: {count} tensors on rank 0 loaded from {path}")
