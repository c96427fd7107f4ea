"""inference.py's sampling: the warpers are transformers', and the draws follow the warped softmax.

``adaptor.inference.warp`` (temperature, then top-k, then top-p, in transformers' order) must give the
scores transformers' ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper`` give, -inf
where they filter. ``sample`` draws 40000 first tokens from 24 logits; each token's frequency must lie
within 5 standard deviations (sqrt(p(1-p)/n)) of its warped probability p, and tokens the warpers
removed are never drawn. With 24 tokens the chance that a correct sampler fails is below
24 x 5.7e-7 (two-sided 5 sigma) ~ 1.4e-5; a sampler that ignored top-p here would put about 8% of the
draws on removed tokens.
"""
from __future__ import annotations

import math

import pytest
import torch

from adaptor.inference import Sampling, sample, warp

SETTINGS = [Sampling(), Sampling(temperature=0.7), Sampling(top_k=5), Sampling(top_p=0.8),
            Sampling(temperature=1.3, top_k=10, top_p=0.9), Sampling(temperature=0.5, top_k=1)]


def _transformers_warp(scores: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    if sampling.temperature != 1.0:
        scores = TemperatureLogitsWarper(sampling.temperature)(None, scores)
    if sampling.top_k > 0:
        scores = TopKLogitsWarper(sampling.top_k)(None, scores)
    if sampling.top_p < 1.0:
        scores = TopPLogitsWarper(sampling.top_p)(None, scores)
    return scores


@pytest.mark.parametrize("sampling", SETTINGS, ids=str)
def test_warpers_equal_transformers(sampling):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    ours, theirs = warp(logits, sampling), _transformers_warp(logits.clone(), sampling)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = ~torch.isinf(ours)
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=0, atol=0)


@pytest.mark.parametrize("sampling", [Sampling(temperature=0.8, top_k=12, top_p=0.85), Sampling(top_p=0.6)], ids=str)
def test_first_token_frequencies_follow_the_warped_softmax(sampling):
    logits = torch.randn(24, generator=torch.Generator().manual_seed(1)) * 2
    p = torch.softmax(warp(logits[None], sampling), dim=-1)[0].double()
    draws = 40000
    counts = torch.zeros(24, dtype=torch.float64)
    generator = torch.Generator().manual_seed(5)
    for _ in range(draws // 1000):
        tokens = sample(logits[None].expand(1000, -1), sampling, generator)
        counts += torch.bincount(tokens, minlength=24).double()
    frequency = counts / draws
    assert counts[p == 0].sum() == 0, "a removed token was drawn"
    assert (p == 0).any(), "the setting removes some tokens"
    bound = 5 * torch.sqrt(p * (1 - p) / draws)
    assert torch.all((frequency - p).abs() <= bound), (frequency, p)


def test_a_seed_gives_the_same_draws():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    setting = Sampling(temperature=0.9, top_p=0.95)
    first = sample(logits, setting, torch.Generator().manual_seed(11))
    assert torch.equal(first, sample(logits, setting, torch.Generator().manual_seed(11)))
    assert not math.isnan(float(first.float().mean()))
