"""``--precompute-ref-logps``: the reference over every pair of the dataset, before the first training step.

The reference is frozen, so the values the reference pass would compute for each micro-batch during
training can as well be computed once, up front, pair by pair in the dataset's stored order; the run then
trains against them as a ``--ref-logps`` run does, and writes them for later runs. When the reference is
the policy's starting model, the pass runs on the policy itself before its first step changes it (in
eval mode), so no second copy of the weights is ever made; with LoRA it runs with the adapters off; a
``--ref-model`` is loaded for the pass and dropped after it.

The pass goes through Megatron's own forward-backward function (``forward_only``), so every layout the
training runs in (tensor, pipeline with virtual stages, context, expert parallelism) computes it the same
way. Data-parallel ranks take turns over the micro-batches, each the same number (the last ones padded
with samples whose pairs are marked absent, so that expert all-to-alls stay matched), and add their
shares over the data-parallel group.
"""
from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import torch

from adaptor.preference.pairwise_dataset import PAIR_INDEX, PairwiseLowLevel, build_pair


def micro_batches(low: PairwiseLowLevel, seq_length: int, pad_id: int, micro_batch_size: int, part: int,
                  parts: int) -> tuple[int, Iterator[dict]]:
    """(how many, the micro-batches) of this data-parallel rank's (``part`` of ``parts``) share of the
    dataset's samples in stored order, collated as Megatron's data loader collates them; built as they are
    read, so a large dataset is never held in memory."""
    from torch.utils.data import default_collate

    total = -(-len(low) // micro_batch_size)
    total = -(-total // parts) * parts  # every rank the same number
    mine = range(part, total, parts)

    def build(k: int) -> dict:
        samples = []
        for i in range(k * micro_batch_size, (k + 1) * micro_batch_size):
            sample = build_pair(low, min(i, len(low) - 1), seq_length, pad_id)
            if i >= len(low):
                sample[PAIR_INDEX] = torch.full_like(sample[PAIR_INDEX], -1)  # padding: no pair of its own
            samples.append(sample)
        return default_collate(samples)

    return len(mine), (build(k) for k in mine)


def shaped_like(data_iterator, items: list):
    """Iterators over ``items`` where Megatron's ``data_iterator`` reads data (one, or one per model chunk;
    None where a rank or chunk reads none)."""
    if isinstance(data_iterator, list):
        return [shaped_like(one, items) for one in data_iterator]
    return None if data_iterator is None else iter(items)


def run(schedule, kwargs: dict, step, models: list, batches: tuple[int, Iterator[dict]]) -> None:
    """``step`` (the reference's forward step, which records its values) over ``batches`` (as
    :func:`micro_batches` gives them), forward only, a training step's worth of micro-batches per call of
    Megatron's ``schedule``. Ranks that read no data build none."""
    count, batches = batches
    per_call = kwargs["num_microbatches"]
    reads = _reads_data(kwargs["data_iterator"])
    for start in range(0, count, per_call):
        n = min(per_call, count - start)
        items = list(itertools.islice(batches, n)) if reads else []
        schedule(**dict(kwargs, forward_step_func=step, data_iterator=shaped_like(kwargs["data_iterator"], items),
                        model=models, forward_only=True, num_microbatches=n))


def _reads_data(data_iterator) -> bool:
    if isinstance(data_iterator, list):
        return any(_reads_data(one) for one in data_iterator)
    return data_iterator is not None


def gather(values: np.ndarray, group) -> np.ndarray:
    """Each data-parallel rank's recorded rows (NaN where another rank computed the pair) added over
    ``group``; every pair must have been computed exactly once."""
    known = ~np.isnan(values).any(axis=1)
    device = torch.cuda.current_device()  # the accelerator's collectives take its tensors
    total = torch.from_numpy(np.where(known[:, None], values, 0.0)).to(device)
    counts = torch.from_numpy(known.astype(np.float64)).to(device)
    if group is not None and torch.distributed.get_world_size(group) > 1:
        torch.distributed.all_reduce(total, group=group)
        torch.distributed.all_reduce(counts, group=group)
    if not bool((counts == 1).all()):
        missing = int((counts == 0).sum())
        raise RuntimeError(f"--precompute-ref-logps: {missing} of {len(counts)} pairs were not computed")
    return total.cpu().numpy()
