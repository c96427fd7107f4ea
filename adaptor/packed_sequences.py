"""Packed documents for the attention kernels: a micro-batch as one THD stream with its boundaries.

``--reset-attention-mask`` / ``--dataloader-inter-document-masking`` mean a token attends only within
its document; fused kernels want boundaries (``cu_seqlens``), not Megatron's dense mask. Where
:func:`adaptor.batch_format.batch_format` says attention takes THD, :func:`pack` flattens the rows into
one [1, b*s] stream; under CP each document is padded to 2 x CP and split into the balanced chunks r
and 2CP-1-r (as TE and megatron-core's THD RoPE do; pads carry no loss and change no real output);
under ``--sequence-parallel`` a pad document makes the length divisible by TP. It returns [1, t_local]
tensors and the ``PackedSeqParams`` for attention and RoPE.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from megatron.core.packed_seq_params import PackedSeqParams


@dataclass
class PackedBatch:
    tokens: Optional[torch.Tensor]
    labels: Optional[torch.Tensor]
    loss_mask: Optional[torch.Tensor]
    position_ids: Optional[torch.Tensor]
    params: PackedSeqParams
    others: dict = field(default_factory=dict)  # the ``carry`` tensors of the batch, laid out the same way


def lengths_from_eod(tokens: torch.Tensor, eod: int) -> list[list[int]]:
    """Document lengths per row as GPTDataset's ``reset_attention_mask`` cuts them: after each EOD."""
    rows = []
    for row in tokens:
        ends = ((row[:-1] == eod).nonzero().flatten() + 1).tolist()
        bounds = [0, *ends, row.numel()]
        rows.append([b - a for a, b in zip(bounds[:-1], bounds[1:])])
    return rows


def lengths_from_cu_seqlens(cu_seqlens: torch.Tensor, seq_length: int) -> list[list[int]]:
    """Document lengths per row from GPTDataset's ``cu_seqlens`` rows (padded with ``seq_length``)."""
    rows = []
    for row in cu_seqlens.tolist():
        end = row.index(seq_length) + 1 if seq_length in row else len(row)
        row = row[:end]
        rows.append([b - a for a, b in zip(row[:-1], row[1:]) if b > a])
    return rows


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def pack(batch: dict, row_lengths: Sequence[Sequence[int]], *, cp_size: int = 1, cp_rank: int = 0,
         cp_group=None, tp_multiple: int = 1, carry: Sequence[str] = ()) -> PackedBatch:
    """``batch`` ([b, s] tensors, or None) -> this CP rank's THD stream and its PackedSeqParams; the
    ``carry`` keys (other per-token [b, s] tensors) come back in ``others``, pads 0."""
    unit = 2 * cp_size if cp_size > 1 else 1
    real = [n for row in row_lengths for n in row]
    padded = [_round_up(n, unit) for n in real]
    total = sum(padded)
    needed = _round_up(total, unit * tp_multiple)
    if needed > total:
        real.append(0)
        padded.append(needed - total)
        total = needed

    # Where each stream token comes from in the flattened rows (-1: a pad token).
    source, start = [], 0
    for n, p in zip(real, padded):
        source.extend(range(start, start + n))
        source.extend([-1] * (p - n))
        start += n
    keep = []
    offset = 0
    for p in padded:
        chunk = p // (2 * cp_size) if cp_size > 1 else p
        if cp_size > 1:
            for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
                keep.extend(range(offset + c * chunk, offset + (c + 1) * chunk))
        else:
            keep.extend(range(offset, offset + p))
        offset += p
    taken = torch.tensor([source[i] for i in keep], dtype=torch.long)

    def gather(x: Optional[torch.Tensor], pad_value) -> Optional[torch.Tensor]:
        if x is None:
            return None
        flat = x.reshape(-1)
        idx = taken.to(flat.device)
        out = flat.index_select(0, idx.clamp(min=0))
        return out.masked_fill(idx < 0, pad_value).unsqueeze(0)

    device = next(t.device for t in batch.values() if t is not None)
    cu_real = torch.tensor(list(itertools.accumulate(real, initial=0)), dtype=torch.int32, device=device)
    cu_padded = torch.tensor(list(itertools.accumulate(padded, initial=0)), dtype=torch.int32, device=device)
    params = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu_real, cu_seqlens_kv=cu_real, cu_seqlens_q_padded=cu_padded,
        cu_seqlens_kv_padded=cu_padded, max_seqlen_q=max(padded), max_seqlen_kv=max(padded), cp_group=cp_group,
    )
    return PackedBatch(
        tokens=gather(batch.get("tokens"), 0),
        labels=gather(batch.get("labels"), 0),
        loss_mask=gather(batch.get("loss_mask"), 0.0),
        position_ids=gather(batch.get("position_ids"), 0),
        params=params,
        others={k: gather(batch.get(k), 0) for k in carry},
    )
