"""Pretrain a GPT model (Qwen3, Llama, ...) with Megatron's own training loop.

    torchrun --nproc_per_node N pretrain_gpt.py <Megatron-LM arguments>

``import adaptor`` comes first: it picks the backend (NPU, CUDA or CPU) and
patches megatron-core so the arguments below run unchanged on each of them.
This file holds only what Megatron asks of a training script: a model
provider, a forward step with its loss, and a dataset provider.
"""
import adaptor  # noqa: F401  (first: patches megatron for this machine)

import warnings
from functools import partial

import torch

from megatron.core import mpu
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.enums import ModelType
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.multi_token_prediction import mtp_on_this_rank
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
from megatron.core.utils import get_attr_wrapped_model, get_batch_on_this_cp_rank, get_batch_on_this_tp_rank
from megatron.training import get_args, get_timers, get_tokenizer, pretrain, print_rank_0
from megatron.training.argument_utils import pretrain_cfg_container_from_args
from megatron.training.arguments import core_transformer_config_from_args, parse_and_validate_args
from megatron.training.utils import get_blend_and_blend_per_split, is_first_or_last_pipeline_stage

from adaptor.batch_format import batch_format
from adaptor.errors import fail
from adaptor.fim_data import fim_fields
from adaptor.finetune.batches import finetune_batch
from adaptor.finetune.instruction_dataset import InstructionDataset
from adaptor.layer_specs import gpt_layer_spec, gpt_mtp_block_spec
from adaptor.lm_loss import masked_lm_loss
from adaptor.packed_sequences import lengths_from_cu_seqlens, lengths_from_eod, pack

BATCH_KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    """Build megatron.core's GPTModel with the layer spec the adaptor picks for this backend."""
    args = get_args()
    print_rank_0("building GPT model ...")
    config = config or core_transformer_config_from_args(args)
    layer_spec = gpt_layer_spec(args, config, vp_stage=vp_stage)
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
        rope_scaling=args.use_rope_scaling,
        rope_scaling_factor=args.rope_scaling_factor,
        seq_len_interpolation_factor=args.rotary_seq_len_interpolation_factor,
        mtp_block_spec=gpt_mtp_block_spec(args, config, layer_spec, vp_stage=vp_stage),
        vp_stage=vp_stage,
        pg_collection=pg_collection,
    )


def mtp_on_this_stage(vp_stage=None) -> bool:
    """Whether this pipeline stage holds MTP layers (the last stage, or where --pipeline-model-parallel-layout puts them)."""
    args = get_args()
    layout = args.pipeline_model_parallel_layout
    if isinstance(layout, (str, list)):
        layout = PipelineParallelLayerLayout(layout, args.pipeline_model_parallel_size)
    return mtp_on_this_rank(layout, args.mtp_num_layers, ignore_virtual=False, vp_stage=vp_stage)


def get_batch(data_iterator, vp_stage=None):
    """Next micro-batch: read on TP rank 0, broadcast over the TP group, split for CP.

    ``adaptor.batch_format.batch_format`` says what the batch gives attention. Where attention
    takes THD, the batch becomes one stream of documents with its boundaries, split per document
    for CP, and the sixth element is the PackedSeqParams attention reads them from. Fine-tuning
    data (``--is-instruction-dataset``, ``--sft``) carries conversation boundaries in every row:
    ``adaptor.finetune.batches`` turns them into that stream or into a dense mask. A stage holding
    MTP layers needs tokens and positions too, wherever it sits in the pipeline.
    """
    args = get_args()
    mtp_here = mtp_on_this_stage(vp_stage)
    if not (is_first_or_last_pipeline_stage(vp_stage) or mtp_here):
        return None, None, None, None, None, None
    fmt = batch_format(args)
    tp_rank = mpu.get_tensor_model_parallel_rank()
    batch, raw = {}, {}
    if tp_rank == 0:
        raw = next(data_iterator)
        device = torch.cuda.current_device()
        batch = {k: (raw[k].to(device, non_blocking=True) if raw.get(k) is not None else None) for k in BATCH_KEYS}
    batch = get_batch_on_this_tp_rank(
        batch,
        has_cu_seqlens=False,
        is_hybrid_cp=False,
        create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader and not fmt.finetuning,
        broadcast_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        broadcast_group=mpu.get_tensor_model_parallel_group(),
        cp_size=args.context_parallel_size,
        tp_rank=tp_rank,
        micro_batch_size=args.micro_batch_size,
        seq_length=args.seq_length,
        mtp_on_this_rank=mtp_here,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        is_pipeline_first_stage=mpu.is_pipeline_first_stage(),
        is_pipeline_last_stage=mpu.is_pipeline_last_stage(),
    )
    cu_seqlens = None
    if fmt.reads_cu_seqlens:
        cu_seqlens = broadcast_from_tp_rank_0(raw.get("cu_seqlens"), (args.micro_batch_size, args.seq_length + 1),
                                              torch.int32)
    if fmt.finetuning:
        num_tokens = None
        if not args.sft:  # instruction datasets give each row's real length
            num_tokens = broadcast_from_tp_rank_0(raw.get("num_tokens"), (args.micro_batch_size,), torch.int64)
        return finetune_batch(batch, cu_seqlens, num_tokens, args, cp_rank=mpu.get_context_parallel_rank(),
                              cp_group=mpu.get_context_parallel_group())
    if fmt.thd:
        if cu_seqlens is not None:
            lengths = lengths_from_cu_seqlens(cu_seqlens, args.seq_length)
        else:
            lengths = lengths_from_eod(batch["tokens"], get_tokenizer().eod)
        packed = pack(batch, lengths, cp_size=args.context_parallel_size,
                      cp_rank=mpu.get_context_parallel_rank(), cp_group=mpu.get_context_parallel_group(),
                      tp_multiple=args.tensor_model_parallel_size if args.sequence_parallel else 1)
        return packed.tokens, packed.labels, packed.loss_mask, None, packed.position_ids, packed.params
    batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=mpu.get_context_parallel_group())
    return (*(batch.get(k) for k in BATCH_KEYS), None)


def broadcast_from_tp_rank_0(tensor, shape, dtype):
    """``tensor`` (given on TP rank 0) on every rank of the TP group; ``shape``/``dtype`` size the others'."""
    device = torch.cuda.current_device()
    if mpu.get_tensor_model_parallel_rank() == 0:
        tensor = tensor.to(device)
    else:
        tensor = torch.empty(shape, dtype=dtype, device=device)
    torch.distributed.broadcast(tensor, mpu.get_tensor_model_parallel_src_rank(),
                                group=mpu.get_tensor_model_parallel_group())
    return tensor


def forward_step(data_iterator, model: GPTModel):
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    vp_stage = get_attr_wrapped_model(model, "vp_stage")
    tokens, labels, loss_mask, attention_mask, position_ids, packed_seq_params = get_batch(data_iterator, vp_stage)
    timers("batch-generator").stop()
    output = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask,
                   packed_seq_params=packed_seq_params)
    return output, partial(masked_lm_loss, loss_mask)


def gpt_dataset_config(args) -> GPTDatasetConfig:
    """GPTDatasetConfig from the arguments; Megatron's GPTFIMDatasetConfig for --fim-data."""
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config_type, fim = GPTDatasetConfig, {}
    if args.fim_data:
        from megatron.training.datasets.fim_dataset import GPTFIMDatasetConfig

        try:
            config_type, fim = GPTFIMDatasetConfig, fim_fields(args, get_tokenizer())
        except ValueError as exc:
            fail(str(exc))
    return config_type(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=args.split,
        num_dataset_builder_threads=args.num_dataset_builder_threads,
        path_to_cache=args.data_cache_path,
        mmap_bin_files=args.mmap_bin_files,
        tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader and not batch_format(args).finetuning,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
        allow_ambiguous_pad_tokens=args.allow_ambiguous_pad_tokens,
        inter_document_masking=bool(args.dataloader_inter_document_masking),
        context_parallel_size=args.context_parallel_size,
        **fim,
    )


def is_dataset_built_on_rank(vp_stage=None):
    return ((is_first_or_last_pipeline_stage(vp_stage) or mtp_on_this_stage(vp_stage))
            and mpu.get_tensor_model_parallel_rank() == 0)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """GPTDataset blends for --data-path (Megatron's GPTFIMDataset with --fim-data), MockGPTDataset for
    --mock-data; for fine-tuning, instruction datasets (--is-instruction-dataset) or Megatron's SFTDataset
    (--sft)."""
    args = get_args()
    dataset_type = MockGPTDataset if args.mock_data else GPTDataset
    if args.fim_data and not args.mock_data:
        from megatron.training.datasets.fim_dataset import GPTFIMDataset

        dataset_type = GPTFIMDataset
    if getattr(args, "is_instruction_dataset", False):
        dataset_type = InstructionDataset
    elif args.sft:
        from megatron.training.datasets.sft_dataset import SFTDataset

        dataset_type = SFTDataset
    print_rank_0(f"> building train, validation, and test datasets ({dataset_type.__name__}) ...")
    datasets = BlendedMegatronDatasetBuilder(
        dataset_type, train_val_test_num_samples,
        partial(is_dataset_built_on_rank, vp_stage=vp_stage), gpt_dataset_config(args),
    ).build()
    # A split whose --split share rounds to zero documents, and that owes no samples
    # (--eval-iters 0), is absent rather than empty: Megatron's sampler rejects empty datasets.
    train_ds, valid_ds, test_ds = (
        None if ds is not None and len(ds) == 0 and not owed else ds
        for ds, owed in zip(datasets, train_val_test_num_samples)
    )
    print_rank_0("> finished creating GPT datasets ...")
    return train_ds, valid_ds, test_ds


train_valid_test_datasets_provider.is_distributed = True


def main(choose_steps=None):
    """Parse the arguments and train. ``choose_steps(args)`` may return another (forward step, dataset
    provider) pair for this run (posttrain_gpt.py's DPO); None keeps this file's."""
    args = parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    step, datasets = forward_step, train_valid_test_datasets_provider
    if choose_steps is not None:
        step, datasets = choose_steps(args) or (step, datasets)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ModelConfig.*model provider.*")
        cfg = pretrain_cfg_container_from_args(args)
    pretrain(cfg, datasets, ModelType.encoder_or_decoder, step, model_provider=model_provider)


if __name__ == "__main__":
    main()
