"""Packed documents reach the attention kernel as boundaries (THD), not as a dense [s, s] mask.

Upstream: ``--reset-attention-mask`` makes megatron-core's ``GPTDataset`` build a [1, s, s] mask that
``DotProductAttention`` applies (s x s memory), and ``--dataloader-inter-document-masking``'s
``cu_seqlens`` reach only Transformer Engine. Wherever ``adaptor.batch_format.batch_format`` says
attention takes THD (``--use-flash-attn``, CP, or inter-document masking, whose ``module_swaps`` row
swaps the core attention), ``pretrain_gpt.py``'s ``get_batch`` packs the micro-batch
(``adaptor.packed_sequences.pack``) with ``PackedSeqParams`` and no dense mask is built. Upstream's
unfused ``DotProductAttention`` (CP = 1) and pipeline parallelism keep the dense mask.

RoPE positions restart per document in THD; scores depend only on query-key distance, so results
equal the dense mask's. Learned absolute positions read ``--reset-position-ids`` as before.
"""
from __future__ import annotations

from adaptor.batch_format import batch_format
from adaptor.features import ArgumentError, Feature
from adaptor.log import notice_once


class PackedSequences(Feature):
    name = "packed_sequences"
    module_swaps = (
        # attention takes THD (adaptor.batch_format): inter-document masking needs no --use-flash-attn
        ("batch_format.thd", "megatron.core.transformer.dot_product_attention:DotProductAttention",
         "adaptor.ops.flash_attention:FlashAttention"),
    )

    def set_defaults(self, args, ctx) -> None:
        if batch_format(args).thd and args.create_attention_mask_in_dataloader:
            notice_once("packed documents: attention gets their boundaries (THD), so the dataloader builds "
                        "no [s, s] attention mask")
            args.create_attention_mask_in_dataloader = False

    def validate(self, args, ctx) -> None:
        if args.transformer_impl == "transformer_engine":
            if getattr(args, "dataloader_inter_document_masking", False):
                raise ArgumentError("--dataloader-inter-document-masking with --transformer-impl transformer_engine: "
                                    "get_batch hands document boundaries to the local attention only, so Transformer "
                                    "Engine's would attend across documents; use --transformer-impl local")
            return
        if args.pipeline_model_parallel_size == 1:
            return
        if getattr(args, "dataloader_inter_document_masking", False):
            raise ArgumentError("--dataloader-inter-document-masking needs --pipeline-model-parallel-size 1: middle "
                                "pipeline stages receive no batch to read the document boundaries from; use "
                                "--reset-attention-mask (a dense per-document mask) with pipeline parallelism")
        if args.reset_attention_mask and (args.context_parallel_size or 1) > 1:
            raise ArgumentError("--reset-attention-mask with --context-parallel-size > 1 needs "
                                "--pipeline-model-parallel-size 1: context parallelism takes document boundaries, "
                                "which middle pipeline stages do not receive")
