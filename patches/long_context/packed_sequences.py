"""Packed documents reach the attention kernel as boundaries (THD), not as a dense [s, s] mask.

Upstream: with ``--reset-attention-mask`` megatron-core's ``GPTDataset`` builds a [1, s, s] mask
per sample and ``DotProductAttention`` applies it, so every document pair of a sequence costs
s x s memory; ``--dataloader-inter-document-masking`` makes the dataset return ``cu_seqlens``
rows, which Megatron-LM hands only to Transformer Engine. Here, wherever
``adaptor.batch_format.batch_format`` says attention takes THD (the adaptor's core attention:
``--use-flash-attn``, context parallelism, or inter-document masking, whose ``module_swaps`` row
swaps it in), ``pretrain_gpt.py``'s ``get_batch`` turns the micro-batch into one stream of
documents (``adaptor.packed_sequences.pack``) with ``PackedSeqParams``:
``npu_fusion_attention`` runs TND with ``actual_seq_qlen/kvlen``, CUDA and CPU run one fused call
per document, and context parallelism splits each document over the CP ranks. The dataloader
then builds no dense mask. With megatron-core's unfused ``DotProductAttention`` (no
``--use-flash-attn``, CP = 1), and with pipeline parallelism (whose middle stages get no batch),
``--reset-attention-mask`` keeps the dense mask.

Documents restart their RoPE positions in THD; attention scores depend only on the distance
between query and key, which is the same inside each document, so the result is the dense
mask's. Learned absolute position embeddings read ``--reset-position-ids``'s positions as before.
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
