"""What a micro-batch gives attention in this run: document boundaries, and in which form.

Boundaries come from the run's data (EOD tokens with ``--reset-attention-mask``, the dataset's
``cu_seqlens`` with ``--dataloader-inter-document-masking`` or fine-tuning data); the form is THD
(``PackedSeqParams``) only where the adaptor's core attention reads it. The dataloader, the
layer-spec swaps, ``pretrain_gpt.py``'s ``get_batch`` and the fine-tuning batches all ask
:func:`batch_format`, so they cannot disagree.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Boundaries(enum.Enum):
    NONE = "none"                    # one causal sequence per row
    EOD = "eod"                      # a document ends after each EOD token (--reset-attention-mask)
    DOCUMENTS = "documents"          # GPTDataset's cu_seqlens rows (--dataloader-inter-document-masking)
    CONVERSATIONS = "conversations"  # fine-tuning data's cu_seqlens (--is-instruction-dataset, --sft, pairs)


@dataclass(frozen=True)
class BatchFormat:
    boundaries: Boundaries
    thd: bool  # one THD stream with PackedSeqParams; otherwise a dense mask (or none)

    @property
    def reads_cu_seqlens(self) -> bool:
        """get_batch takes the dataset's ``cu_seqlens`` (broadcast over the TP group)."""
        return self.boundaries in (Boundaries.DOCUMENTS, Boundaries.CONVERSATIONS)

    @property
    def finetuning(self) -> bool:
        """Conversations: the fine-tuning batch builds its own mask; the dataloader builds none."""
        return self.boundaries is Boundaries.CONVERSATIONS


def batch_format(args) -> BatchFormat:
    """The boundaries this run's batches carry and whether attention takes them as THD.

    Fine-tuning data (conversations, DPO's pairs) always carries conversation boundaries. Pretraining
    documents reach attention as THD with the adaptor's core attention; inter-document masking swaps that attention in, so it
    is always THD without Transformer Engine. With Transformer Engine nothing is packed: the
    dataset's dense ``--reset-attention-mask`` mask is all attention gets (inter-document masking
    is refused there by the packed_sequences feature).
    """
    if _on(args, "sft") or _on(args, "is_instruction_dataset") or _on(args, "is_pairwise_dataset"):
        return BatchFormat(Boundaries.CONVERSATIONS, thd=_thd_attention(args))
    inter_document = _on(args, "dataloader_inter_document_masking")
    if _transformer_engine(args):
        eod = _on(args, "reset_attention_mask") and not inter_document
        return BatchFormat(Boundaries.EOD if eod else Boundaries.NONE, thd=False)
    if inter_document:
        return BatchFormat(Boundaries.DOCUMENTS, thd=True)
    if _on(args, "reset_attention_mask"):
        return BatchFormat(Boundaries.EOD, thd=_thd_attention(args))
    return BatchFormat(Boundaries.NONE, thd=False)


def _thd_attention(args) -> bool:
    """The adaptor's core attention (--use-flash-attn or CP) on one pipeline stage reads THD.

    Megatron-core's unfused attention takes only a dense mask, and the middle stages of a pipeline
    receive no batch to read boundaries from.
    """
    if _transformer_engine(args) or (getattr(args, "pipeline_model_parallel_size", None) or 1) != 1:
        return False
    return _on(args, "use_flash_attn") or (getattr(args, "context_parallel_size", None) or 1) > 1


def _transformer_engine(args) -> bool:
    return getattr(args, "transformer_impl", None) == "transformer_engine"


def _on(args, name: str) -> bool:
    # Gates read partial namespaces too (a library user's, a test's): a missing flag is off.
    return bool(getattr(args, name, False))
