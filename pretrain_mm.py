"""Pretrain a vision-language model (ViT encoder, projector, Qwen3-style decoder) with Megatron's own loop.

    torchrun --nproc_per_node N pretrain_mm.py --mm-model model.json --mm-data data.json <Megatron arguments>

As pretrain_gpt.py: ``import adaptor`` first, then what Megatron asks of a training script — a
model provider (megatron-core's ``LLaVAModel``, :mod:`adaptor.mm.model`), a forward step with
its loss, and a dataset provider (JSONL image-text records, :mod:`adaptor.mm.data`) — handed to
``megatron.training.pretrain()``. model.json describes the three parts (and fills the decoder's
Megatron flags), data.json the records and image preprocessing; --seq-length is the length the
language model sees, image embeddings included.
"""
import adaptor  # noqa: F401  (first: patches megatron for this machine)

import warnings
from functools import partial

import torch

from megatron.core import mpu, tensor_parallel
from megatron.core.enums import ModelType
from megatron.training import get_args, get_timers, get_tokenizer, pretrain, print_rank_0
from megatron.training.argument_utils import pretrain_cfg_container_from_args
from megatron.training.arguments import core_transformer_config_from_args, parse_and_validate_args

from adaptor import run_state
from adaptor.errors import fail
from adaptor.mm.config import cached_data_config, cached_model_config, image_seq_len
from adaptor.mm.data import ImageTextDataset, MMDataError, describe_skipped, read_records
from adaptor.mm.model import build_llava_model
from adaptor.mm.weights import load_initial_weights
from adaptor.lm_loss import masked_lm_loss


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    """megatron-core's LLaVAModel from model.json, with the initial weights it names."""
    args = get_args()
    print_rank_0("building LLaVA model ...")
    model_cfg = cached_model_config(args.mm_model)
    config = config or core_transformer_config_from_args(args)
    model = build_llava_model(args, model_cfg, config, pre_process, post_process, vp_stage, pg_collection)
    load_initial_weights(model, model_cfg, args)
    return model


def get_batch(data_iterator):
    """Next micro-batch: read on TP rank 0, broadcast over the TP group."""
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
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    images, tokens, labels, loss_mask = get_batch(data_iterator)
    timers("batch-generator").stop()
    # LLaVAModel puts the image embeddings at the image token and returns the per-token loss with
    # the loss mask stretched to the combined (image + text) sequence.
    output, loss_mask = model(images, tokens, None, None, labels=labels, loss_mask=loss_mask)
    return output, partial(masked_lm_loss, loss_mask)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """The records of data.json's data_path for training (built on TP rank 0; no validation split)."""
    args = get_args()
    if mpu.get_tensor_model_parallel_rank() != 0:
        return None, None, None
    data_cfg = cached_data_config(args.mm_data)
    model_cfg = cached_model_config(args.mm_model)
    print_rank_0(f"> building image-text dataset from {data_cfg.data_path} ...")
    try:
        records, skipped = read_records(data_cfg.data_path, data_cfg.data_folder, args.mm_skip_bad_records)
    except (MMDataError, OSError) as exc:
        fail(str(exc))
    print_rank_0(describe_skipped(data_cfg.data_path, len(records), skipped))
    text_len = args.seq_length - image_seq_len(model_cfg.vision) + 1
    train = ImageTextDataset(records, train_val_test_num_samples[0], text_len, get_tokenizer(), data_cfg,
                             args.seed, args.mm_skip_bad_records, data_cfg.data_path)
    return train, None, None


train_valid_test_datasets_provider.is_distributed = True


def main():
    if not run_state.context().flags.mm_model:  # before Megatron asks for the --num-layers model.json gives
        fail("pretrain_mm.py needs --mm-model model.json and --mm-data data.json")
    args = parse_and_validate_args(args_defaults={"tokenizer_type": "HuggingFaceTokenizer"})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ModelConfig.*model provider.*")
        cfg = pretrain_cfg_container_from_args(args)
    pretrain(cfg, train_valid_test_datasets_provider, ModelType.encoder_or_decoder, forward_step,
             model_provider=model_provider)


if __name__ == "__main__":
    main()
