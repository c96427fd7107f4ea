"""Instruction datasets for supervised fine-tuning, read from ``tools/preprocess_data.py``'s output.

``--data-path PREFIX`` (blends work) names three indexed datasets, MindSpeed-LLM's layout:

* ``PREFIX_packed_input_ids_document``: token ids, one document per sample (a conversation, or
  with ``--pack`` several conversations);
* ``PREFIX_packed_labels_document``: the token id where the token is in the loss (assistant
  turns), ``-100`` elsewhere;
* ``PREFIX_packed_attention_mask_document``: the 1-based index of the conversation each token
  belongs to inside its sample.

A sample gives Megatron's ``tokens``, ``labels``, ``loss_mask`` (next token an assistant token of the
same conversation), ``position_ids`` restarting per conversation and ``cu_seqlens`` (padded with
``seq_length``), so conversations attend only to themselves; ``num_tokens`` serves
``--variable-seq-lengths``. Longer samples are cut (counted in the log), shorter padded without loss.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np
import torch

from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.megatron_dataset import MegatronDataset
from megatron.core.datasets.utils import Split

IGNORE_INDEX = -100
FIELDS = ("input_ids", "labels", "attention_mask")


class InstructionDataError(ValueError):
    """A dataset that cannot be read as an instruction dataset; the message is one line."""


def field_prefix(prefix: str, name: str) -> str:
    return f"{prefix}_packed_{name}_document"


def read_meta(prefix: str) -> Optional[dict]:
    """The preprocessing summary written beside the datasets (``PREFIX_packed_meta.json``), if any."""
    path = f"{prefix}_packed_meta.json"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def check_prefix(prefix: str) -> None:
    missing = [field_prefix(prefix, n) + ext for n in FIELDS[:2] for ext in (".bin", ".idx")
               if not os.path.exists(field_prefix(prefix, n) + ext)]
    if missing:
        hint = (" (it looks like a pretraining dataset: drop --is-instruction-dataset)"
                if os.path.exists(prefix + ".bin") else
                " (build it with tools/preprocess_data.py --handler-name AlpacaStyleInstructionHandler ...)")
        raise InstructionDataError(f"--data-path {prefix}: not an instruction dataset, {missing[0]} is missing{hint}")


class InstructionLowLevel:
    """The three indexed datasets of one prefix, read together."""

    def __init__(self, prefix: str, mmap: bool = True) -> None:
        check_prefix(prefix)
        self.prefix = prefix
        self.input_ids = IndexedDataset(field_prefix(prefix, "input_ids"), mmap=mmap)
        self.labels = IndexedDataset(field_prefix(prefix, "labels"), mmap=mmap)
        mask_path = field_prefix(prefix, "attention_mask")
        self.segments = IndexedDataset(mask_path, mmap=mmap) if os.path.exists(mask_path + ".idx") else None
        lengths = self.input_ids.sequence_lengths
        if len(self.labels) != len(self.input_ids) or not np.array_equal(self.labels.sequence_lengths, lengths):
            raise InstructionDataError(f"--data-path {prefix}: its input_ids and labels datasets disagree on the "
                                       "samples' lengths (written by different runs?)")
        if self.segments is not None and not np.array_equal(self.segments.sequence_lengths, lengths):
            raise InstructionDataError(f"--data-path {prefix}: its input_ids and attention_mask datasets disagree "
                                       "on the samples' lengths (written by different runs?)")

    def __len__(self) -> int:
        return len(self.input_ids)

    def sample(self, i: int):
        ids = np.asarray(self.input_ids[i], dtype=np.int64)
        labels = np.asarray(self.labels[i], dtype=np.int64)
        seg = (np.asarray(self.segments[i], dtype=np.int64) if self.segments is not None
               else np.ones_like(ids))
        return ids, labels, seg


def build_sample(ids: np.ndarray, labels: np.ndarray, seg: np.ndarray, seq_length: int, pad_id: int) -> dict:
    """One training sample of ``seq_length`` positions from one stored document (see module doc)."""
    n = min(len(ids), seq_length + 1)
    ids, labels, seg = ids[:n], labels[:n], seg[:n]
    real = max(n - 1, 0)
    tokens = np.full(seq_length, pad_id, dtype=np.int64)
    target = np.full(seq_length, pad_id, dtype=np.int64)
    loss_mask = np.zeros(seq_length, dtype=np.float32)
    tokens[:real] = ids[:-1]
    next_labels = labels[1:]
    same_conversation = seg[1:] == seg[:-1]
    in_loss = (next_labels != IGNORE_INDEX) & same_conversation
    target[:real] = np.where(in_loss, next_labels, ids[1:])
    loss_mask[:real] = in_loss
    # Conversations: maximal runs of one segment index over the input positions.
    starts = [0] + [i for i in range(1, real) if seg[i] != seg[i - 1]]
    bounds = starts + [real]
    positions = np.zeros(seq_length, dtype=np.int64)
    for a, b in zip(bounds[:-1], bounds[1:]):
        positions[a:b] = np.arange(b - a)
    if real < seq_length:  # the padding: its own loss-free document after the last conversation
        positions[real:] = np.arange(seq_length - real)
        bounds.append(seq_length)
    cu = np.full(seq_length + 1, seq_length, dtype=np.int32)
    cu[:len(bounds)] = bounds
    return {
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(target),
        "loss_mask": torch.from_numpy(loss_mask),
        "position_ids": torch.from_numpy(positions),
        "cu_seqlens": torch.from_numpy(cu),
        "num_tokens": torch.tensor(real, dtype=torch.int64),
    }


def pad_id(tokenizer) -> int:
    """The token padding is written with: the tokenizer's pad token, else 0 (padding is never in the loss
    and comes after every real token, so any id gives the same loss)."""
    pad = getattr(tokenizer, "pad", None) if tokenizer is not None else None
    return int(pad) if pad is not None and pad >= 0 else 0


class InstructionDataset(MegatronDataset):
    """Megatron dataset over :class:`InstructionLowLevel`: one sample per stored document, epochs reshuffled."""

    LOW_LEVEL = InstructionLowLevel  # what build_low_level_dataset opens (subclasses: their own files)

    def __init__(self, dataset: InstructionLowLevel, dataset_path: Optional[str], indices: np.ndarray,
                 num_samples: Optional[int], index_split: Split, config) -> None:
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)
        self.num_samples = len(indices) if num_samples is None else max(num_samples, len(indices))
        self._epochs: dict[int, np.ndarray] = {}
        self._pad = pad_id(config.tokenizer)

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: InstructionLowLevel) -> int:
        return len(low_level_dataset)

    @classmethod
    def build_low_level_dataset(cls, dataset_path: str, config) -> InstructionLowLevel:
        from adaptor.errors import fail

        try:
            return cls.LOW_LEVEL(dataset_path, mmap=config.mmap_bin_files)
        except InstructionDataError as exc:
            fail(str(exc))

    def __len__(self) -> int:
        return self.num_samples

    def _order(self, epoch: int) -> np.ndarray:
        """The split's documents in epoch ``epoch``'s order (the first epoch as stored when it fits)."""
        if epoch not in self._epochs:
            rng = np.random.RandomState(self.config.random_seed + epoch)
            self._epochs = {epoch: self.indices[rng.permutation(len(self.indices))]}
        return self._epochs[epoch]

    def __getitem__(self, idx: int) -> dict:
        epoch, within = divmod(int(idx), len(self.indices))
        doc = int(self._order(epoch)[within])
        ids, labels, seg = self.dataset.sample(doc)
        return build_sample(ids, labels, seg, self.config.sequence_length, self._pad)


def dense_mask_from_cu_seqlens(cu_seqlens: torch.Tensor, seq_length: int) -> torch.Tensor:
    """[b, 1, s, s] bool, True where attention is masked: causal inside each document, nothing across."""
    from adaptor.packed_sequences import lengths_from_cu_seqlens

    rows = []
    for lengths in lengths_from_cu_seqlens(cu_seqlens, seq_length):
        doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        rows.append(doc)
    doc = torch.stack(rows).to(cu_seqlens.device)
    same = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(seq_length, seq_length, dtype=torch.bool, device=cu_seqlens.device).tril()
    return ~(same & causal).unsqueeze(1)
