"""``--variable-seq-lengths`` for DPO's rows (adaptor.finetune.batches.cut_after_last_loss).

A micro-batch of chosen and rejected rows is cut after its last position in the loss, rounded up to a
multiple of 8 (times TP with sequence parallelism, and to the two chunks per context-parallel rank):
every position in the loss stays, with the tokens before it, which under a causal mask is all its
log-probability reads.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from adaptor.finetune.batches import cut_after_last_loss


def rows(last_in_loss: list[int], seq: int = 64) -> dict:
    loss_mask = torch.zeros(len(last_in_loss), seq)
    for r, last in enumerate(last_in_loss):
        loss_mask[r, last - 3:last + 1] = 1
    tokens = torch.arange(seq).repeat(len(last_in_loss), 1)
    return {"tokens": tokens, "labels": tokens + 1, "loss_mask": loss_mask, "position_ids": None}


def args(tp=1, sp=False, cp=1, seq=64):
    return SimpleNamespace(seq_length=seq, tensor_model_parallel_size=tp, sequence_parallel=sp,
                           context_parallel_size=cp)


@pytest.mark.parametrize("given,last,length", [
    (args(), [20, 9, 33, 12], 40),                 # 34 positions -> multiple of 8
    (args(tp=2, sp=True), [20, 9, 33, 12], 48),    # -> multiple of 16
    (args(cp=4), [20, 9, 33, 12], 40),             # lcm(8, 2 x 4) = 8
    (args(cp=8), [20, 9, 33, 12], 48),             # lcm(8, 16) = 16
    (args(), [63, 9], 64),                         # never past --seq-length
])
def test_rows_are_cut_after_the_last_position_in_the_loss(given, last, length):
    batch = rows(last)
    cut = cut_after_last_loss(batch, given)
    assert cut["position_ids"] is None
    for key in ("tokens", "labels", "loss_mask"):
        assert cut[key].shape == (len(last), length)
        assert torch.equal(cut[key], batch[key][:, :length])
    assert cut["loss_mask"].sum() == batch["loss_mask"].sum()  # nothing in the loss dropped
