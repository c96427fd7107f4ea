"""Vocabulary-parallel cross entropy, chunked over tokens.

Same result as megatron-core's ``tensor_parallel.vocab_parallel_cross_entropy`` (no label smoothing,
as Megatron's fused path), without its full-size fp32 buffers (2.5 GB each for a 151936 vocabulary
and 4096 tokens). Forward and backward run per chunk of tokens in one reused fp32 work buffer (two
all-reduces per chunk); backward keeps only the logits, the per-token fp32 log-sum-exp, the target
mask and local ids, recomputes the softmax and writes the gradient into the logits' own storage when contiguous
(``ADAPTOR_CE_GRAD_IN_PLACE=0``: a separate buffer). Chunk: ``ADAPTOR_CE_CHUNK_TOKENS``, or what fits
a 128 MiB fp32 chunk of the local vocabulary (220 tokens for 151936).

The same torch code runs on NPU, CUDA and CPU. torch_npu's ``npu_cross_entropy_loss`` is not used: it
needs the whole vocabulary on one device and returns a full ``log_prob``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel.utils import VocabUtility
from megatron.core.utils import get_pg_rank, get_pg_size

from adaptor import env

CHUNK_ENV = "ADAPTOR_CE_CHUNK_TOKENS"
IN_PLACE_ENV = "ADAPTOR_CE_GRAD_IN_PLACE"
DEFAULT_CHUNK_BYTES = 128 * 2**20


def chunk_tokens(vocab_local: int) -> int:
    """Tokens per chunk: ``ADAPTOR_CE_CHUNK_TOKENS`` or a 128 MiB fp32 chunk."""
    value = env.value(CHUNK_ENV)
    if value:
        try:
            tokens = int(value)
        except ValueError:
            tokens = 0
        if tokens <= 0:
            raise ValueError(f"{CHUNK_ENV}={value!r} must be a positive number of tokens")
        return tokens
    return max(1, DEFAULT_CHUNK_BYTES // (4 * vocab_local))


def _grad_in_place() -> bool:
    return env.value(IN_PLACE_ENV) != "0"


def _shifted(rows: torch.Tensor, shift: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``rows - shift[:, None]`` in fp32 into ``out``: one pass for fp32 rows; for bf16/fp16 rows an
    upcast copy and then the subtraction, because CPU kernels mixing a low-precision and an fp32
    operand run several times slower than the two passes (measured in benchmarks/README.md)."""
    if rows.dtype == torch.float32:
        return torch.sub(rows, shift.unsqueeze(-1), out=out)
    return out.copy_(rows).sub_(shift.unsqueeze(-1))


class ChunkedVocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, tp_group, chunk):
        if tp_group is None:
            from megatron.core.parallel_state import get_tensor_model_parallel_group

            tp_group = get_tensor_model_parallel_group()
        world = get_pg_size(tp_group)
        vocab = logits.size(-1)
        start, end = VocabUtility.vocab_range_from_per_partition_vocab_size(
            vocab, get_pg_rank(tp_group), world
        )
        x2d = logits.reshape(-1, vocab)
        t1d = target.reshape(-1)
        n = x2d.size(0)
        target_mask = (t1d < start) | (t1d >= end)
        local_target = (t1d - start).masked_fill(target_mask, 0)
        loss = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        work = torch.empty(min(chunk, n), vocab, dtype=torch.float32, device=logits.device)
        for i in range(0, n, chunk):
            j = min(i + chunk, n)
            x = work[: j - i]
            logits_max = x2d[i:j].amax(dim=-1).float()  # exact: the max is one of the values
            if world > 1:
                dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=tp_group)
            _shifted(x2d[i:j], logits_max, out=x)
            stats = torch.empty(2, j - i, dtype=torch.float32, device=logits.device)
            stats[0].copy_(x.gather(1, local_target[i:j].unsqueeze(-1)).squeeze(-1))
            stats[0].masked_fill_(target_mask[i:j], 0.0)
            torch.sum(x.exp_(), dim=-1, out=stats[1])
            if world > 1:  # target logit and sum of exp in one call
                dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=tp_group)
            log_sum = stats[1].log()
            torch.sub(log_sum, stats[0], out=loss[i:j])
            torch.add(log_sum, logits_max, out=lse[i:j])
        del work
        ctx.chunk = chunk
        ctx.save_for_backward(logits, lse, target_mask, local_target)
        return loss.view(target.shape)

    @staticmethod
    def backward(ctx, grad_output):
        logits, lse, target_mask, local_target = ctx.saved_tensors
        chunk = ctx.chunk
        vocab = logits.size(-1)
        x2d = logits.reshape(-1, vocab)
        n = x2d.size(0)
        if _grad_in_place() and logits.is_contiguous():
            grad = logits  # consumed by the loss; see the module docstring
        else:
            grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        g2d = grad.view(-1, vocab)
        g_out = grad_output.reshape(-1).float()
        hit = (~target_mask).float()
        # fp32 logits whose storage takes the gradient need no work buffer: each chunk is computed in place.
        direct = grad is logits and logits.dtype == torch.float32
        work = None if direct else torch.empty(min(chunk, n), vocab, dtype=torch.float32, device=logits.device)
        rows = torch.arange(min(chunk, n), device=logits.device)
        for i in range(0, n, chunk):
            j = min(i + chunk, n)
            x = g2d[i:j] if direct else work[: j - i]
            _shifted(x2d[i:j], lse[i:j], out=x).exp_()  # softmax
            x[rows[: j - i], local_target[i:j]] -= hit[i:j]
            x.mul_(g_out[i:j].unsqueeze(-1))
            if not direct:
                g2d[i:j].copy_(x)  # into the logits' dtype
        return grad, None, None, None


def fused_vocab_parallel_cross_entropy(vocab_parallel_logits, target, tp_group=None):
    """Drop-in for ``megatron.core.fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy``.

    ``vocab_parallel_logits``: [s, b, vocab/TP] (any float dtype); ``target``:
    [s, b] global token ids. Returns the fp32 per-token loss [s, b].
    """
    chunk = chunk_tokens(vocab_parallel_logits.size(-1))
    return ChunkedVocabParallelCrossEntropy.apply(vocab_parallel_logits, target, tp_group, chunk)
