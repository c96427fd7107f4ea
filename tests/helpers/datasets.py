"""Megatron indexed datasets (.bin/.idx) written by megatron-core's own IndexedDatasetBuilder."""
from __future__ import annotations

from pathlib import Path


def write_indexed_dataset(prefix, documents, dtype) -> Path:
    """``documents`` (sequences of token ids), one document each, at ``prefix``.bin/.idx; returns the prefix."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in documents:
        tokens = torch.as_tensor(doc)
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(f"{prefix}.idx")
    return Path(prefix)
