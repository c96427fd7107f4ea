"""A fine-tuning micro-batch as the model takes it: conversation boundaries, loss-free padding cut.

Instruction datasets (:mod:`adaptor.finetune.instruction_dataset`) and Megatron's ``--sft``
``SFTDataset`` both hand over rows of several conversations with their boundaries
(``cu_seqlens``). Attention must not cross them:

* where attention takes THD (:func:`adaptor.batch_format.batch_format`: the adaptor's core
  attention on one pipeline stage), the rows become one THD stream
  (:func:`adaptor.packed_sequences.pack`);
* otherwise attention gets a dense [b, 1, s, s] mask, causal inside each conversation.

``--variable-seq-lengths`` (MindSpeed-LLM's ``--no-pad-to-seq-lengths``) drops the padding after
the micro-batch's longest sample: THD streams leave the padding document out; dense rows are cut
to that length rounded up to a multiple of 8 (times TP with sequence parallelism). Padding is
loss-free and comes after every real token under a causal mask, so the loss is the same.
"""
from __future__ import annotations

import math

import torch

from adaptor.batch_format import batch_format
from adaptor.finetune.instruction_dataset import dense_mask_from_cu_seqlens
from adaptor.packed_sequences import lengths_from_cu_seqlens, pack

PAD_MULTIPLE = 8


def variable_lengths(args) -> bool:
    return bool(getattr(args, "variable_seq_lengths_sft", False))


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


MODEL_KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids", "packed_seq_params")


def finetune_batch(batch: dict, cu_seqlens: torch.Tensor, num_tokens: torch.Tensor | None, args, *,
                   cp_rank: int = 0, cp_group=None):
    """(tokens, labels, loss_mask, attention_mask, position_ids, packed_seq_params) of one micro-batch.

    ``batch`` holds [b, s] tensors (None for keys this stage does not need); ``num_tokens`` the real
    length of each row (None: unknown, nothing is cut).
    """
    rows = finetune_rows(batch, cu_seqlens, num_tokens, args, cp_rank=cp_rank, cp_group=cp_group)
    return tuple(rows.get(k) for k in MODEL_KEYS)


def finetune_rows(batch: dict, cu_seqlens: torch.Tensor, num_tokens: torch.Tensor | None, args, *,
                  cp_rank: int = 0, cp_group=None, carry: tuple = ()) -> dict:
    """:func:`finetune_batch` as a dict: ``MODEL_KEYS``, and the ``carry`` keys of ``batch`` (other
    per-token [b, s] tensors, such as DPO's pair slots) laid out as the tokens are."""
    seq = args.seq_length
    loss_mask = batch.get("loss_mask")
    if batch.get("labels") is not None and loss_mask is not None:
        # labels under a zero mask may be -100 (SFTDataset); the loss must not read them
        batch = dict(batch, labels=torch.where(loss_mask.bool(), batch["labels"], torch.zeros_like(batch["labels"])))
    tp_multiple = args.tensor_model_parallel_size if args.sequence_parallel else 1
    cut = variable_lengths(args) and num_tokens is not None
    if batch_format(args).thd:
        rows = lengths_from_cu_seqlens(cu_seqlens, seq)
        if cut:
            rows = [_real_documents(r, int(n)) for r, n in zip(rows, num_tokens.tolist())]
            batch = {k: (None if v is None else _select_rows(v, rows, seq)) for k, v in batch.items()}
        packed = pack(batch, rows, cp_size=args.context_parallel_size, cp_rank=cp_rank, cp_group=cp_group,
                      tp_multiple=tp_multiple, carry=carry)
        return {"tokens": packed.tokens, "labels": packed.labels, "loss_mask": packed.loss_mask,
                "attention_mask": None, "position_ids": packed.position_ids, "packed_seq_params": packed.params,
                **packed.others}
    mask = dense_mask_from_cu_seqlens(cu_seqlens, seq)
    if cut:
        length = min(seq, _round_up(max(int(num_tokens.max()), 1), PAD_MULTIPLE * tp_multiple))
        batch = {k: (None if v is None else v[:, :length]) for k, v in batch.items()}
        mask = mask[:, :, :length, :length]
    return {"tokens": batch.get("tokens"), "labels": batch.get("labels"), "loss_mask": batch.get("loss_mask"),
            "attention_mask": mask, "position_ids": batch.get("position_ids"), "packed_seq_params": None,
            **{k: batch.get(k) for k in carry}}


def cut_after_last_loss(rows: dict, args) -> dict:
    """``--variable-seq-lengths`` for rows without boundaries (DPO's chosen and rejected rows): each [r, s]
    tensor cut after the micro-batch's last position in the loss, rounded up as above (and to the two
    chunks per context-parallel rank). Under a causal mask the tokens after it reach no loss."""
    seq, loss_mask = args.seq_length, rows["loss_mask"]
    in_loss = loss_mask.nonzero()
    last = int(in_loss[:, 1].max()) + 1 if in_loss.numel() else 1
    tp_multiple = args.tensor_model_parallel_size if args.sequence_parallel else 1
    unit = math.lcm(PAD_MULTIPLE * tp_multiple, 2 * (args.context_parallel_size or 1))
    length = min(seq, _round_up(last, unit))
    return {k: (None if v is None else v[:, :length]) for k, v in rows.items()}


def _real_documents(lengths: list[int], real: int) -> list[int]:
    """The documents of a row that hold its first ``real`` tokens (the padding document dropped)."""
    kept, total = [], 0
    for n in lengths:
        if total >= real:
            break
        kept.append(n)
        total += n
    return kept


def _select_rows(x: torch.Tensor, rows: list[list[int]], seq: int) -> torch.Tensor:
    """``x`` [b, s] with each row's tokens after its kept documents moved out of reach of pack().

    pack() reads each row's documents from the flattened [b*s] tensor in order, assuming the rows'
    lengths sum to s; with the padding dropped they do not, so the kept tokens are laid out
    contiguously instead.
    """
    parts = [x[i, :sum(r)] for i, r in enumerate(rows)]
    return torch.cat(parts).unsqueeze(0)
