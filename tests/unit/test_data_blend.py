"""`--data-path 0.8 A 0.2 B` draws samples from A and B in those proportions.

The blend is built exactly as pretrain_gpt.py builds it: the weight/prefix
list parsed by Megatron's ``get_blend_from_list``, then
``BlendedMegatronDatasetBuilder(GPTDataset, ...)`` over real indexed files.
A's documents use token ids below 500 and B's ids from 500 up, so every
sample's own tokens say which dataset it really came from; the blend's
``dataset_id`` is checked against them rather than trusted.

Tolerance: Megatron's blending index is greedy — each next sample goes to the
dataset furthest below its target share — so after n samples every count is
within one of ``weight * n``. Over 2000 samples that is 0.0005 of the share;
we allow 0.005, and 0.02 within the first 100 samples, which a random draw
(standard deviation 0.04 at n = 100) would often miss.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

SEQ = 32
N_TRAIN = 2000


def write_dataset(prefix, low: int, high: int, seed: int, docs: int = 200):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(docs):
        length = int(rng.integers(20, 120))
        builder.add_document(torch.from_numpy(rng.integers(low, high, size=length).astype(np.int64)), [length])
    builder.finalize(f"{prefix}.idx")


def null_tokenizer():
    """Megatron's NullTokenizer over ids 0..999 (its eod is the last id, 999)."""
    from megatron.core.tokenizers import MegatronTokenizer

    return MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=1000)


@pytest.mark.parametrize("weights", [(0.8, 0.2), (0.3, 0.7)])
def test_blend_draws_in_proportion(tmp_path, weights):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    a, b = tmp_path / "a_text_document", tmp_path / "b_text_document"
    write_dataset(a, 1, 500, seed=1)
    write_dataset(b, 500, 999, seed=2)
    tokenizer = null_tokenizer()
    assert tokenizer.eod >= 999  # no document token can be taken for it
    blend = get_blend_from_list([str(weights[0]), str(a), str(weights[1]), str(b)])
    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=SEQ, blend=blend, split="100,0,0",
        tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, path_to_cache=str(tmp_path / "cache"),
    )
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [N_TRAIN, 0, 0], lambda: True, config).build()
    assert len(train) == N_TRAIN

    ids = np.array([int(train[i]["dataset_id"]) for i in range(N_TRAIN)])
    for i in range(0, N_TRAIN, 97):  # the id matches where the tokens came from
        tokens = train[i]["tokens"].numpy()
        real = tokens[tokens != tokenizer.eod]
        assert ((real < 500) if ids[i] == 0 else (real >= 500)).all(), (i, ids[i], real[:10])

    share_a = float(np.mean(ids == 0))
    assert abs(share_a - weights[0]) <= 0.005, share_a
    assert abs(float(np.mean(ids[:100] == 0)) - weights[0]) <= 0.02, ids[:100]
