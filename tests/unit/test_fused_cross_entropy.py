"""--cross-entropy-loss-fusion: the chunked vocabulary-parallel cross entropy against Megatron's, in this process.

Reference: megatron-core's ``tensor_parallel.vocab_parallel_cross_entropy`` on
the same logits, on a one-process gloo group.

Tolerances. fp32: both compute the same formulas in fp32 (ours subtracts the
log-sum-exp where Megatron divides by the sum), so losses agree to a few fp32
ulps of the loss (~1e-6 abs for losses near 7) and gradients to ~1e-7 abs
(softmax values are at most 1). bf16: the loss is computed in fp32 from the
same upcast logits, so it agrees as tightly as in fp32; the gradient is
rounded to bf16 by both, and fp32 values a few ulps apart can round to
neighbouring bf16 values: one bf16 step, 2**-8 relative.

TP=2 on two gloo processes and pretrain_gpt.py runs with the flag: tests/e2e/test_fused_cross_entropy.py.
"""
from __future__ import annotations

import argparse

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from adaptor.ops import cross_entropy as ce

BF16_STEP = 2.0**-8


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """A one-process gloo group: Megatron's reference all-reduces even at TP=1."""
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def megatron_ce(logits, target, grad_out, group):
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    x = logits.clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(x, target, tp_group=group)
    loss.backward(grad_out)
    return loss.detach(), x.grad


def ours(logits, target, grad_out, group, chunk):
    x = logits.clone().requires_grad_()
    loss = ce.ChunkedVocabParallelCrossEntropy.apply(x, target, group, chunk)
    loss.backward(grad_out)
    return loss.detach(), x.grad


def sample(s, b, v, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(s, b, v, generator=gen) * 4).to(dtype)
    target = torch.randint(0, v, (s, b), generator=gen)
    grad_out = torch.rand(s, b, generator=gen)
    return logits, target, grad_out


@pytest.mark.parametrize("chunk", [1, 7, 32, 33, 1000])  # 33 tokens: 7 and 32 do not divide it
def test_fp32_matches_megatron(group, chunk):
    logits, target, grad_out = sample(11, 3, 257, torch.float32)
    ref_loss, ref_grad = megatron_ce(logits, target, grad_out, group)
    loss, grad = ours(logits, target, grad_out, group, chunk)
    assert loss.dtype == torch.float32 and loss.shape == (11, 3)
    assert grad.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [5, 64])
def test_bf16_matches_megatron(group, chunk):
    logits, target, grad_out = sample(16, 2, 300, torch.bfloat16, seed=1)
    ref_loss, ref_grad = megatron_ce(logits, target, grad_out, group)
    loss, grad = ours(logits, target, grad_out, group, chunk)
    assert grad.dtype == torch.bfloat16  # no fp32 gradient handed back
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=BF16_STEP, atol=1e-8)
    # and not trivially: the gradient is far from zero
    assert ref_grad.float().abs().max() > 0.1


def test_labels_outside_the_vocabulary_match_megatron(group):
    """Megatron has no ignore_index (the loss mask comes later): an id no rank owns (-100, padding)
    gives log-sum-exp minus the row max (Megatron's target term is x_t - max, and 0 for no owner)."""
    logits, target, grad_out = sample(9, 2, 128, torch.float32, seed=2)
    target[0, 0], target[3, 1], target[5, 0] = -100, 128, 500
    ref_loss, ref_grad = megatron_ce(logits, target, grad_out, group)
    loss, grad = ours(logits, target, grad_out, group, 4)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)
    row = logits[0, 0]
    assert torch.allclose(loss[0, 0], torch.logsumexp(row, -1) - row.max())


def test_gradient_buffer_in_place_and_separate(group, monkeypatch):
    logits, target, grad_out = sample(6, 2, 64, torch.bfloat16, seed=3)
    ref_loss, ref_grad = megatron_ce(logits, target, grad_out, group)
    results = {}
    for mode in ("1", "0"):
        monkeypatch.setenv(ce.IN_PLACE_ENV, mode)
        x = logits.clone().requires_grad_()
        y = x * 1  # a non-leaf, as the output layer's logits are
        seen = []
        y.register_hook(lambda g: seen.append((g.data_ptr() == y.data_ptr(), g.clone())))
        ce.ChunkedVocabParallelCrossEntropy.apply(y, target, group, 5).backward(grad_out)
        results[mode] = seen[0]
    assert results["1"][0] and not results["0"][0]
    for _, grad in results.values():
        torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=BF16_STEP, atol=1e-8)


def test_non_contiguous_logits(group):
    logits, target, grad_out = sample(8, 3, 50, torch.float32, seed=4)
    ref_loss, ref_grad = megatron_ce(logits, target, grad_out, group)
    x = logits.transpose(0, 1).contiguous().requires_grad_()
    loss = ce.ChunkedVocabParallelCrossEntropy.apply(x.transpose(0, 1), target, group, 5)
    loss.backward(grad_out)
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.transpose(0, 1), ref_grad, rtol=1e-5, atol=1e-7)


class LargestFp32(TorchDispatchMode):
    """Records the largest fp32 tensor any op produces (observes; changes nothing)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_fp32_buffers_are_one_chunk(group):
    """bf16 logits: no fp32 tensor larger than one chunk, where Megatron makes full-size ones."""
    s, b, v, chunk = 40, 2, 500, 8
    logits, target, grad_out = sample(s, b, v, torch.bfloat16, seed=5)
    with LargestFp32() as mode:
        ours(logits, target, grad_out, group, chunk)
    assert mode.largest == chunk * v
    with LargestFp32() as mode:
        megatron_ce(logits, target, grad_out, group)
    assert mode.largest == s * b * v


def test_chunk_size_from_environment(monkeypatch):
    monkeypatch.delenv(ce.CHUNK_ENV, raising=False)
    assert ce.chunk_tokens(151936) == 220  # 128 MiB of fp32 rows
    assert ce.chunk_tokens(10**9) == 1
    monkeypatch.setenv(ce.CHUNK_ENV, "4096")
    assert ce.chunk_tokens(151936) == 4096
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(ce.CHUNK_ENV, bad)
        with pytest.raises(ValueError, match=ce.CHUNK_ENV):
            ce.chunk_tokens(100)


def test_feature_flag_and_te_impl():
    from adaptor import run_state
    from adaptor.features import ArgumentError, FeatureContext, FeatureRegistry
    from patches.fusions.cross_entropy import CrossEntropyFusion

    feature = CrossEntropyFusion()
    registry = FeatureRegistry([feature])
    for argv, on in ((["--cross-entropy-loss-fusion"], True), ([], False)):
        ctx = FeatureContext(backend=run_state.backend(), flags=registry.preparse(argv))
        assert feature.enabled(ctx) is on
    args = argparse.Namespace(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    with pytest.raises(ArgumentError, match="--cross-entropy-fusion-impl native") as err:
        feature.validate(args, ctx)
    assert "\n" not in str(err.value)
    feature.validate(argparse.Namespace(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native"), ctx)
