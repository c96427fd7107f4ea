"""Pairwise (preference) datasets, read from ``tools/preprocess_data.py``'s pairwise handlers.

``--data-path PREFIX`` (blends work) names MindSpeed-LLM's layout: four indexed datasets
``PREFIX_packed_{chosen,rejected}_{input_ids,labels}_document``, labels ``-100`` outside the final
response, and (optional, written by this repository's tool) ``PREFIX_packed_{chosen,rejected}_attention_mask_document``,
each token's 1-based pair within its sample. Without ``--pack`` a sample is one pair; with it, a sample
holds several whole pairs, pair k being the k-th segment of both sides.

A sample holds both sides as rows ``[2, seq_length]`` (chosen first) of Megatron's ``tokens`` /
``labels`` / ``loss_mask`` / ``position_ids``, each side built like an instruction sample
(:func:`adaptor.finetune.instruction_dataset.build_sample`: shifted by one, positions restarting per
pair, ``cu_seqlens`` at the pairs' boundaries, padded after its last token without loss), plus
``pair_slot`` (each position's pair within the sample) and ``pair_index`` (the sample's pairs' indices in
the dataset as stored, ``-1`` after the last), which say which sequence log-probability each token adds to.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from megatron.core.datasets.indexed_dataset import IndexedDataset

from adaptor.finetune.instruction_dataset import (InstructionDataError, InstructionDataset, build_sample,
                                                  field_prefix)

SIDES = ("chosen", "rejected")
FIELDS = tuple(f"{side}_{name}" for side in SIDES for name in ("input_ids", "labels"))
SEGMENT_FIELDS = tuple(f"{side}_attention_mask" for side in SIDES)
KEYS = ("tokens", "labels", "loss_mask", "position_ids")
PAIR_SLOT = "pair_slot"  # [2, s]: each position's pair within its sample (0-based)
PAIR_INDEX = "pair_index"  # [max_pairs]: the sample's pairs' positions in the stored dataset, -1 after the last


def max_pairs(seq_length: int) -> int:
    """The pairs a sample of ``seq_length`` positions can hold (each side of a pair has a token)."""
    return seq_length + 1


def is_pairwise_prefix(prefix: str) -> bool:
    return all(os.path.exists(field_prefix(prefix, name) + ".idx") for name in FIELDS)


def check_prefix(prefix: str) -> None:
    """Raise :class:`InstructionDataError` (one line) unless ``prefix`` names a pairwise dataset."""
    missing = [field_prefix(prefix, n) + ext for n in FIELDS for ext in (".bin", ".idx")
               if not os.path.exists(field_prefix(prefix, n) + ext)]
    if not missing:
        return
    if os.path.exists(field_prefix(prefix, "input_ids") + ".bin"):
        hint = " (it is an instruction dataset, for --stage sft --is-instruction-dataset)"
    elif os.path.exists(prefix + ".bin"):
        hint = " (it is a pretraining dataset)"
    else:
        hint = " (build it with tools/preprocess_data.py --handler-name AlpacaStylePairwiseHandler ...)"
    raise InstructionDataError(f"--data-path {prefix}: not a pairwise dataset, {missing[0]} is missing{hint}")


class PairwiseLowLevel:
    """The indexed datasets of one prefix, read together."""

    def __init__(self, prefix: str, mmap: bool = True) -> None:
        check_prefix(prefix)
        self.prefix = prefix
        present = [name for name in SEGMENT_FIELDS if os.path.exists(field_prefix(prefix, name) + ".idx")]
        if len(present) == 1:
            raise InstructionDataError(f"--data-path {prefix}: {field_prefix(prefix, present[0])} has no "
                                       f"{'rejected' if 'chosen' in present[0] else 'chosen'} counterpart "
                                       f"(written by different runs?)")
        self.fields = {name: IndexedDataset(field_prefix(prefix, name), mmap=mmap) for name in FIELDS + tuple(present)}
        for side in SIDES:
            names = [f"{side}_input_ids", f"{side}_labels"] + [n for n in present if n.startswith(side)]
            lengths = self.fields[names[0]].sequence_lengths
            for name in names[1:]:
                if len(self.fields[name]) != len(lengths) or not np.array_equal(self.fields[name].sequence_lengths,
                                                                                 lengths):
                    raise InstructionDataError(f"--data-path {prefix}: its {side} {names[0].split('_', 1)[1]} and "
                                               f"{name.split('_', 1)[1]} disagree on the samples' lengths "
                                               f"(written by different runs?)")
        if len(self.fields["chosen_input_ids"]) != len(self.fields["rejected_input_ids"]):
            raise InstructionDataError(f"--data-path {prefix}: it holds {len(self.fields['chosen_input_ids'])} chosen "
                                       f"and {len(self.fields['rejected_input_ids'])} rejected responses")
        self.pairs_per_sample = np.ones(len(self), dtype=np.int64)
        if present:
            counts = [_last_values(self.fields[name]) for name in SEGMENT_FIELDS]
            if not np.array_equal(counts[0], counts[1]):
                bad = int(np.flatnonzero(counts[0] != counts[1])[0])
                raise InstructionDataError(f"--data-path {prefix}: sample {bad} holds {counts[0][bad]} chosen and "
                                           f"{counts[1][bad]} rejected responses")
            self.pairs_per_sample = counts[0]
        self.first_pair = np.concatenate([[0], np.cumsum(self.pairs_per_sample)[:-1]]).astype(np.int64)
        self.num_pairs = int(self.pairs_per_sample.sum())
        self.packed = bool(len(self) and self.pairs_per_sample.max() > 1)

    def __len__(self) -> int:
        return len(self.fields["chosen_input_ids"])

    def side(self, i: int, side: str):
        """(ids, labels, 1-based pair of each token) of sample ``i``'s ``side``."""
        ids = np.asarray(self.fields[f"{side}_input_ids"][i], dtype=np.int64)
        labels = np.asarray(self.fields[f"{side}_labels"][i], dtype=np.int64)
        segments = self.fields.get(f"{side}_attention_mask")
        seg = np.asarray(segments[i], dtype=np.int64) if segments is not None else np.ones_like(ids)
        return ids, labels, seg


def _last_values(dataset: IndexedDataset) -> np.ndarray:
    """Each document's last value (a pair-index field: the number of pairs in the sample), without
    reading the documents one by one."""
    index = dataset.index
    lengths = np.asarray(index.sequence_lengths, dtype=np.int64)
    if not lengths.size:
        return lengths
    if lengths.min() < 1:
        raise InstructionDataError(f"{dataset.path_prefix}: an empty sample")
    values = np.memmap(dataset.path_prefix + ".bin", dtype=index.dtype, mode="r")
    at = np.asarray(index.sequence_pointers, dtype=np.int64) // np.dtype(index.dtype).itemsize + lengths - 1
    return np.asarray(values[at], dtype=np.int64)


def build_pair(low: PairwiseLowLevel, i: int, seq_length: int, pad_id: int) -> dict:
    """Sample ``i`` as ``{key: [2, ...]}``: row 0 chosen, row 1 rejected (module doc), and ``pair_index``."""
    rows = []
    for side in SIDES:
        ids, labels, seg = low.side(i, side)
        if low.pairs_per_sample[i] > 1 and len(ids) > seq_length + 1:
            raise InstructionDataError(f"--data-path {low.prefix}: sample {i} packs {low.pairs_per_sample[i]} pairs "
                                       f"into {len(ids)} tokens, more than --seq-length {seq_length} + 1; train "
                                       f"with the --seq-length the data were packed for")
        row = build_sample(ids, labels, seg, seq_length, pad_id)
        slot = np.zeros(seq_length, dtype=np.int64)
        real = int(row["num_tokens"])
        slot[:real] = seg[:real] - 1
        row[PAIR_SLOT] = torch.from_numpy(slot)
        rows.append(row)
    sample = {key: torch.stack([row[key] for row in rows]) for key in rows[0]}
    count = int(low.pairs_per_sample[i])
    index = torch.full((max_pairs(seq_length),), -1, dtype=torch.int64)
    index[:count] = torch.arange(count) + int(low.first_pair[i])
    sample[PAIR_INDEX] = index
    return sample


class PairwiseDataset(InstructionDataset):
    """Megatron dataset over :class:`PairwiseLowLevel`: one sample per stored sample (a pair, or with
    ``--pack`` several), epochs reshuffled."""

    LOW_LEVEL = PairwiseLowLevel

    def __getitem__(self, idx: int) -> dict:
        epoch, within = divmod(int(idx), len(self.indices))
        return build_pair(self.dataset, int(self._order(epoch)[within]), self.config.sequence_length, self._pad)


def rows_of_pairs(x: torch.Tensor) -> torch.Tensor:
    """[b, 2, ...] -> [2b, ...]: the b chosen rows, then the b rejected rows (one forward pass for both)."""
    return torch.cat([x[:, 0], x[:, 1]], dim=0)
