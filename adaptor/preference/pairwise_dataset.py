"""Pairwise (preference) datasets, read from ``tools/preprocess_data.py``'s pairwise handlers.

``--data-path PREFIX`` (blends work) names four indexed datasets, MindSpeed-LLM's layout:
``PREFIX_packed_{chosen,rejected}_{input_ids,labels}_document``, one document per pair side, labels
``-100`` outside the final response. A sample holds both sides as rows ``[2, seq_length]`` (chosen
first) of Megatron's ``tokens`` / ``labels`` / ``loss_mask`` / ``position_ids``, each side built like
an instruction sample (:func:`adaptor.finetune.instruction_dataset.build_sample`): shifted by one,
cut to ``seq_length``, padded after its last token without loss. Padding at the end of a causal row
never reaches the real tokens, so no mask is needed.
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
KEYS = ("tokens", "labels", "loss_mask", "position_ids")
PAIR_INDEX = "pair_index"  # the pair's position in the stored dataset, whatever the epoch's order


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
    """The four indexed datasets of one prefix, read together."""

    def __init__(self, prefix: str, mmap: bool = True) -> None:
        check_prefix(prefix)
        self.prefix = prefix
        self.fields = {name: IndexedDataset(field_prefix(prefix, name), mmap=mmap) for name in FIELDS}
        for side in SIDES:
            ids, labels = self.fields[f"{side}_input_ids"], self.fields[f"{side}_labels"]
            if len(ids) != len(labels) or not np.array_equal(ids.sequence_lengths, labels.sequence_lengths):
                raise InstructionDataError(f"--data-path {prefix}: its {side} input_ids and labels disagree on the "
                                           f"samples' lengths (written by different runs?)")
        if len(self.fields["chosen_input_ids"]) != len(self.fields["rejected_input_ids"]):
            raise InstructionDataError(f"--data-path {prefix}: it holds {len(self.fields['chosen_input_ids'])} chosen "
                                       f"and {len(self.fields['rejected_input_ids'])} rejected responses")

    def __len__(self) -> int:
        return len(self.fields["chosen_input_ids"])

    def side(self, i: int, side: str):
        ids = np.asarray(self.fields[f"{side}_input_ids"][i], dtype=np.int64)
        labels = np.asarray(self.fields[f"{side}_labels"][i], dtype=np.int64)
        return ids, labels


def build_pair(low: PairwiseLowLevel, i: int, seq_length: int, pad_id: int) -> dict:
    """``{key: [2, seq_length]}`` for pair ``i``: row 0 chosen, row 1 rejected."""
    rows = []
    for side in SIDES:
        ids, labels = low.side(i, side)
        rows.append(build_sample(ids, labels, np.ones_like(ids), seq_length, pad_id))
    return {key: torch.stack([row[key] for row in rows]) for key in KEYS}


class PairwiseDataset(InstructionDataset):
    """Megatron dataset over :class:`PairwiseLowLevel`: one sample per pair, epochs reshuffled."""

    LOW_LEVEL = PairwiseLowLevel

    def __getitem__(self, idx: int) -> dict:
        epoch, within = divmod(int(idx), len(self.indices))
        pair = int(self._order(epoch)[within])
        sample = build_pair(self.dataset, pair, self.config.sequence_length, self._pad)
        sample[PAIR_INDEX] = torch.tensor(pair, dtype=torch.int64)  # the stored reference's row
        return sample


def rows_of_pairs(x: torch.Tensor) -> torch.Tensor:
    """[b, 2, ...] -> [2b, ...]: the b chosen rows, then the b rejected rows (one forward pass for both)."""
    return torch.cat([x[:, 0], x[:, 1]], dim=0)
