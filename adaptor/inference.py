"""Greedy generation over the Megatron model's own forward: what ``inference.py`` runs.

Why not megatron-core's engine (``megatron.core.inference``): its ``TextGenerationController``
allocates pinned host buffers and a ``torch.cuda.Stream`` in its constructor, and the
``StaticInferenceEngine`` now runs ``DynamicInferenceEngine`` underneath (CUDA events, paged KV
blocks); neither constructs without CUDA, so the same path could not run on CPU and NPU. The loop
here is small, runs the model through Megatron's forward-only pipeline schedule (TP, PP), and keeps
keys and values in megatron-core's own ``StaticInferenceContext`` when asked (``--use-kv-cache``).

Prompts of different lengths share one batch, right-padded, with no padding mask: every step feeds
positions ``[start, end)`` of every row and reads the logits at ``end - 1``; a row whose prompt is
longer than ``end`` keeps its own next prompt token, the others take the argmax. Attention is plain
causal attention over real tokens only (a row's padding lies after its last real token until it is
overwritten by a generated one), so each row computes what it would alone. The first step starts at
the shortest prompt's length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: Set by inference.py (:func:`running_inference`) and evaluation.py
#: (``adaptor.evaluation.running_evaluation``) before Megatron parses: their flags
#: (``patches.inference``) are read by those entries only.
ENTRY = {"inference": False, "evaluation": False}


def running_inference() -> None:
    ENTRY["inference"] = True


@dataclass
class Generated:
    prompt_ids: list[int]
    token_ids: list[int]  # generated, the stop token included when one ended the sequence
    stopped: bool  # ended by a stop token (EOS or --add-eos-token)


def stop_ids(tokenizer, extra: list[str]) -> set[int]:
    """The tokenizer's EOS and each of ``extra`` (a token's text or its id)."""
    ids = set()
    if getattr(tokenizer, "eod", None) is not None:
        ids.add(int(tokenizer.eod))
    for token in extra:
        if token.isdigit():
            ids.add(int(token))
            continue
        found = tokenizer.tokenize(token)
        if len(found) != 1:
            raise ValueError(f"--add-eos-token {token!r} is {len(found)} tokens, not one")
        ids.add(int(found[0]))
    return ids


def _forward_last_logits(model, tokens, position_ids, attention_mask, context):
    """Logits at the last fed position of every row ([batch, vocab], every TP rank), on the last PP stage;
    None on the others."""
    from megatron.core import mpu
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batch, seq = tokens.shape

    def forward_step(data_iterator, chunk):
        output = chunk(tokens, position_ids, attention_mask, inference_context=context,
                       runtime_gather_output=True)
        return output, lambda out, non_loss_data=False: out

    collected = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([None]), model=model, num_microbatches=1,
        seq_length=seq, micro_batch_size=batch, forward_only=True, collect_non_loss_data=True)
    if not mpu.is_pipeline_last_stage():
        return None
    logits = collected[0]  # [batch, seq or 1, vocab]
    return logits[:, -1, :]


def _from_last_stage(next_tokens, shape, device):
    """``next_tokens`` (known on the last pipeline stage) on every stage."""
    from megatron.core import mpu

    if mpu.get_pipeline_model_parallel_world_size() == 1:
        return next_tokens
    if next_tokens is None:
        next_tokens = torch.empty(shape, dtype=torch.int64, device=device)
    torch.distributed.broadcast(next_tokens, mpu.get_pipeline_model_parallel_last_rank(),
                                group=mpu.get_pipeline_model_parallel_group())
    return next_tokens


@torch.no_grad()
def greedy_batch(model, prompts: list[list[int]], *, max_new_tokens: int, max_length: int, stops: set[int],
                 vocab_size: int, use_kv_cache: bool) -> list[Generated]:
    """Greedy continuations of ``prompts`` (token ids), together in one batch.

    Each row gets at most ``max_new_tokens`` new tokens and at most ``max_length`` tokens in all, and
    ends at its first stop token. The argmax runs over the first ``vocab_size`` logits (the tokenizer's
    tokens; the padded rows of the embedding are never chosen).
    """
    from megatron.core.inference.contexts import StaticInferenceContext

    device = next(model[0].parameters()).device
    lengths = [len(p) for p in prompts]
    limits = [min(n + max_new_tokens, max_length) for n in lengths]  # each row's last length
    total = max(limits)
    batch = len(prompts)
    tokens = torch.zeros((batch, total), dtype=torch.int64, device=device)
    for row, ids in enumerate(prompts):
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    positions = torch.arange(total, device=device).unsqueeze(0).expand(batch, -1)
    causal = torch.triu(torch.ones(total, total, dtype=torch.bool, device=device), diagonal=1)[None, None]
    context = StaticInferenceContext(batch, total) if use_kv_cache else None
    lengths_t = torch.tensor(lengths, device=device)
    limits_t = torch.tensor(limits, device=device)
    stops_t = torch.tensor(sorted(stops), dtype=torch.int64, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    done |= lengths_t >= limits_t
    start = 0
    for end in range(min(lengths), total):
        if bool(done.all()):
            break
        first = start if use_kv_cache else 0
        logits = _forward_last_logits(model, tokens[:, first:end], positions[:, first:end],
                                      causal[..., first:end, :end], context)
        chosen = None if logits is None else logits[:, :vocab_size].float().argmax(dim=-1)
        chosen = _from_last_stage(chosen, (batch,), device)
        if context is not None:
            context.sequence_len_offset += end - start
        start = end
        generating = (end >= lengths_t) & ~done  # rows past their prompt, not yet ended
        tokens[:, end] = torch.where(generating, chosen, tokens[:, end])
        ended = generating & (torch.isin(chosen, stops_t) | (end + 1 >= limits_t))
        done |= ended
    out = []
    for row, ids in enumerate(prompts):
        generated = tokens[row, lengths[row]: limits[row]].tolist()
        cut = next((i + 1 for i, t in enumerate(generated) if t in stops), None)
        out.append(Generated(list(ids), generated[:cut] if cut else generated, cut is not None))
    return out
