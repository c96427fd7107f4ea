"""pretrain_mm.py's steps for megatron-core's LLaVAModel (model.json ``model_id: llava``).

A micro-batch is ``images`` [b, C, H, W], ``tokens``/``labels`` [b, s] and ``loss_mask``: read on TP rank 0,
broadcast over the TP group. LLaVAModel puts the image embeddings at the image token and returns the per-token
loss with the loss mask stretched to the combined (image + text) sequence.
"""
from __future__ import annotations

from functools import partial

import torch


def get_batch(data_iterator):
    from megatron.core import mpu, tensor_parallel

    from adaptor.errors import fail
    from adaptor.mm.data import MMDataError

    batch = None
    if mpu.get_tensor_model_parallel_rank() == 0:
        try:
            batch = next(data_iterator)
        except MMDataError as exc:
            fail(exc.line)
    ints = tensor_parallel.broadcast_data(["tokens", "labels"], batch, torch.int64)
    floats = tensor_parallel.broadcast_data(["images", "loss_mask"], batch, torch.float32)
    return floats["images"], ints["tokens"], ints["labels"], floats["loss_mask"]


def forward_step(data_iterator, model):
    from megatron.training import get_timers

    from adaptor.lm_loss import masked_lm_loss

    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    images, tokens, labels, loss_mask = get_batch(data_iterator)
    timers("batch-generator").stop()
    output, loss_mask = model(images, tokens, None, None, labels=labels, loss_mask=loss_mask)
    return output, partial(masked_lm_loss, loss_mask)


def train_dataset(args, data_cfg, model_cfg, num_samples):
    """The records of data.json's data_path (no validation split)."""
    from megatron.training import get_tokenizer, print_rank_0

    from adaptor.errors import fail
    from adaptor.mm.config import image_seq_len
    from adaptor.mm.data import ImageTextDataset, MMDataError, describe_skipped, read_records

    print_rank_0(f"> building image-text dataset from {data_cfg.data_path} ...")
    try:
        records, skipped = read_records(data_cfg.data_path, data_cfg.data_folder, args.mm_skip_bad_records)
    except (MMDataError, OSError) as exc:
        fail(str(exc))
    print_rank_0(describe_skipped(data_cfg.data_path, len(records), skipped))
    text_len = args.seq_length - image_seq_len(model_cfg.vision) + 1
    return ImageTextDataset(records, num_samples, text_len, get_tokenizer(), data_cfg, args.seed,
                            args.mm_skip_bad_records, data_cfg.data_path)
