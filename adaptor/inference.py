"""Generation over the Megatron model's own forward: what ``inference.py`` runs.

Greedy search and sampling share one batched loop (:func:`greedy_batch`); beam search
(:func:`beam_search`) runs one prompt at a time with its beams as the batch.

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

import math
from dataclasses import dataclass
from typing import Callable

import torch

#: Set by inference.py (:func:`running_inference`) and evaluation.py
#: (``adaptor.evaluation.running_evaluation``) before Megatron parses: their flags
#: (``patches.inference``) are read by those entries only.
ENTRY = {"inference": False, "evaluation": False}

# MindSpeed-LLM's task names. do_sample is its older name of greedy_search_with_sampling;
# return_output_log_probs samples the same way and writes each generated token's log-probability.
TASKS = ("greedy_search", "greedy_search_with_sampling", "do_sample", "return_output_log_probs", "beam_search",
         "beam_search_with_sampling", "chat")
SAMPLING_TASKS = ("greedy_search_with_sampling", "do_sample", "return_output_log_probs", "beam_search_with_sampling")
BEAM_TASKS = ("beam_search", "beam_search_with_sampling")
TASK_ALIASES = {"greedy": "greedy_search"}  # MindSpeed-LLM's older name
# MindSpeed-LLM's generation scripts give no --task and no prompt: its inference.py then runs every task,
# in this order, on one fixed prompt, and ends in the terminal conversation.
DEMONSTRATION_TASKS = ("greedy_search", "do_sample", "beam_search", "beam_search_with_sampling",
                       "return_output_log_probs", "chat")
DEMONSTRATION_PROMPT = "how are you?"


def running_inference() -> None:
    ENTRY["inference"] = True


@dataclass
class Generated:
    prompt_ids: list[int]
    token_ids: list[int]  # generated, the stop token included when one ended the sequence
    stopped: bool  # ended by a stop token (EOS or --add-eos-token)
    log_probs: list[float] | None = None  # of each generated token, under the model's softmax (when asked)


@dataclass(frozen=True)
class Sampling:
    """Drawing the next token instead of taking the argmax: the warpers in transformers' order."""

    temperature: float = 1.0
    top_k: int = 0  # 0: every token
    top_p: float = 1.0  # 1.0: every token


def warp(scores: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """``scores`` [rows, vocab] divided by the temperature, then outside the top-k and outside the top-p
    nucleus set to -inf (the smallest set of most likely tokens whose probability reaches top-p; the most
    likely token always stays)."""
    scores = scores.float()
    if sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    if 0 < sampling.top_k < scores.size(-1):
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if sampling.top_p < 1.0:
        ascending, order = torch.sort(scores, dim=-1)
        tail = torch.softmax(ascending, dim=-1).cumsum(dim=-1) <= 1.0 - sampling.top_p
        tail[..., -1] = False
        scores = scores.masked_fill(tail.scatter(-1, order, tail), -math.inf)
    return scores


def sample(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits`` [rows, vocab], drawn from the warped softmax with ``generator``."""
    probs = torch.softmax(warp(logits, sampling), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


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


def forward_logits(model, tokens, position_ids, attention_mask, context=None):
    """Logits at every fed position ([batch, seq, vocab], gathered over TP, so every TP rank holds them) on
    the last pipeline stage, through Megatron's forward-only schedule; None on the other stages.

    It runs under megatron-core's ``InferenceMode``, as its own engines do: the model then skips the
    multi-token-prediction layers, whose output generation and scoring never read (and which keep
    no KV cache of their own).
    """
    from megatron.core import mpu
    from megatron.core.inference.utils import InferenceMode
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batch, seq = tokens.shape

    def forward_step(data_iterator, chunk):
        output = chunk(tokens, position_ids, attention_mask, inference_context=context,
                       runtime_gather_output=True)
        return output, lambda out, non_loss_data=False: out

    with InferenceMode.active():
        collected = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter([None]), model=model, num_microbatches=1,
            seq_length=seq, micro_batch_size=batch, forward_only=True, collect_non_loss_data=True)
    return collected[0] if mpu.is_pipeline_last_stage() else None


def _forward_last_logits(model, tokens, position_ids, attention_mask, context):
    """Logits at the last fed position of every row ([batch, vocab]) on the last PP stage; None elsewhere."""
    logits = forward_logits(model, tokens, position_ids, attention_mask, context)
    return None if logits is None else logits[:, -1, :]


def from_last_stage(values, shape, dtype, device):
    """``values`` (known on the last pipeline stage) on every stage."""
    from megatron.core import mpu

    if mpu.get_pipeline_model_parallel_world_size() == 1:
        return values
    if values is None:
        values = torch.empty(shape, dtype=dtype, device=device)
    values = values.contiguous()
    torch.distributed.broadcast(values, mpu.get_pipeline_model_parallel_last_rank(),
                                group=mpu.get_pipeline_model_parallel_group())
    return values


@torch.no_grad()
def greedy_batch(model, prompts: list[list[int]], *, max_new_tokens: int, max_length: int, stops: set[int],
                 vocab_size: int, use_kv_cache: bool, sampling: Sampling | None = None,
                 generator: torch.Generator | None = None,
                 on_step: Callable[[list[int]], None] | None = None, log_probs: bool = False) -> list[Generated]:
    """Greedy (or, with ``sampling``, sampled) continuations of ``prompts`` (token ids), in one batch.

    Each row gets at most ``max_new_tokens`` new tokens and at most ``max_length`` tokens in all, and
    ends at its first stop token. The choice runs over the first ``vocab_size`` logits (the tokenizer's
    tokens; the padded rows of the embedding are never chosen). Sampled tokens are drawn on the last
    pipeline stage with ``generator``, seeded alike on every rank, so every tensor-parallel rank draws
    the same. ``on_step`` gets the first row's generated ids after each step (``--stream``). With
    ``log_probs``, each generated token's log-probability under the model's own softmax (temperature 1,
    every token: what scoring the finished text would give) comes with it.
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
    scores = torch.zeros((batch, total), dtype=torch.float32, device=device)
    start = 0
    for end in range(min(lengths), total):
        if bool(done.all()):
            break
        first = start if use_kv_cache else 0
        logits = _forward_last_logits(model, tokens[:, first:end], positions[:, first:end],
                                      causal[..., first:end, :end], context)
        chosen = chosen_log_prob = None
        if logits is not None:
            logits = logits[:, :vocab_size].float()
            chosen = logits.argmax(dim=-1) if sampling is None else sample(logits, sampling, generator)
            if log_probs:
                chosen_log_prob = torch.log_softmax(logits, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
        chosen = from_last_stage(chosen, (batch,), torch.int64, device)
        if log_probs:
            chosen_log_prob = from_last_stage(chosen_log_prob, (batch,), torch.float32, device)
        if context is not None:
            context.sequence_len_offset += end - start
        start = end
        generating = (end >= lengths_t) & ~done  # rows past their prompt, not yet ended
        tokens[:, end] = torch.where(generating, chosen, tokens[:, end])
        if log_probs:
            scores[:, end] = torch.where(generating, chosen_log_prob, scores[:, end])
        ended = generating & (torch.isin(chosen, stops_t) | (end + 1 >= limits_t))
        done |= ended
        if on_step is not None and bool(generating[0]):
            on_step(tokens[0, lengths[0]: end + 1].tolist())
    out = []
    for row, ids in enumerate(prompts):
        generated = tokens[row, lengths[row]: limits[row]].tolist()
        stop_at = next((i + 1 for i, t in enumerate(generated) if t in stops), None)
        kept = generated[:stop_at] if stop_at else generated
        row_scores = scores[row, lengths[row]: lengths[row] + len(kept)].tolist() if log_probs else None
        out.append(Generated(list(ids), kept, stop_at is not None, row_scores))
    return out


@torch.no_grad()
def beam_search(model, prompt: list[int], *, num_beams: int, max_new_tokens: int, max_length: int,
                stops: set[int], vocab_size: int, use_kv_cache: bool, length_penalty: float = 1.0,
                sampling: Sampling | None = None, generator: torch.Generator | None = None) -> Generated:
    """The best of ``num_beams`` beams continuing ``prompt``, scored as transformers' beam search scores them.

    Each step extends every beam by every token and keeps the ``keep`` best continuations (``keep``:
    twice the beams, or more with several stop tokens, so that enough survive the ones that stop); the
    best ``num_beams`` that do not stop run on. A continuation among the best ``num_beams`` that ends in a
    stop token, or reaches the length limit, is finished with its summed log-probability divided by its
    generated length to the power ``length_penalty``; the best ``num_beams`` finished ones are kept.
    The search ends when every continuation finishes, or when the best running beam, at its current
    length, can no longer beat the worst kept finished one (transformers' default, ``early_stopping=False``).
    With ``sampling`` the continuations are drawn without replacement from the warped scores instead
    of taken in order (``beam_search_with_sampling``). The log-probabilities reach every pipeline stage,
    so every rank keeps the same beams; the KV cache is reordered with the beams.
    """
    from megatron.core.inference.contexts import StaticInferenceContext

    device = next(model[0].parameters()).device
    beams, length = num_beams, len(prompt)
    limit = min(length + max_new_tokens, max_length)
    keep = max(2, 1 + len(stops)) * beams
    running = torch.zeros((beams, limit), dtype=torch.int64, device=device)
    running[:, :length] = torch.tensor(prompt, dtype=torch.int64, device=device)
    running_scores = torch.full((beams,), -1e9, device=device)
    running_scores[0] = 0.0  # the beams start equal: only the first may be extended at the first step
    kept, kept_scores = running.clone(), torch.full((beams,), -1e9, device=device)
    kept_finished = torch.zeros(beams, dtype=torch.bool, device=device)
    kept_lengths = torch.zeros(beams, dtype=torch.int64, device=device)
    positions = torch.arange(limit, device=device).unsqueeze(0).expand(beams, -1)
    causal = torch.triu(torch.ones(limit, limit, dtype=torch.bool, device=device), diagonal=1)[None, None]
    context = StaticInferenceContext(beams, limit) if use_kv_cache else None
    stops_t = torch.tensor(sorted(stops), dtype=torch.int64, device=device)
    first_of_top = torch.arange(keep, device=device) < beams
    improvable, start = True, 0
    for cur in range(length, limit):
        first = start if use_kv_cache else 0
        logits = _forward_last_logits(model, running[:, first:cur], positions[:, first:cur],
                                      causal[..., first:cur, :cur], context)
        logits = from_last_stage(None if logits is None else logits[:, :vocab_size].float(),
                                 (beams, vocab_size), torch.float32, device)
        if context is not None:
            context.sequence_len_offset += cur - start
        start = cur
        scores = torch.log_softmax(logits, dim=-1)
        if sampling is not None:
            scores = warp(scores, sampling)
        total = (scores + running_scores[:, None]).reshape(-1)
        if sampling is None:
            candidate_scores, index = torch.topk(total, keep)
        else:
            index = torch.multinomial(torch.softmax(total, dim=-1), keep, generator=generator)
            candidate_scores, order = total[index].sort(descending=True)
            index = index[order]
        source, token = index // vocab_size, index % vocab_size
        candidates = running[source].clone()
        candidates[:, cur] = token
        ends = torch.isin(token, stops_t) | (cur + 1 >= limit)
        generated = cur + 1 - length
        finished = candidate_scores / generated ** length_penalty
        finished = finished + (~(ends & first_of_top)).float() * -1e9 + (0.0 if improvable else -1e9)
        merged = torch.cat((kept_scores, finished))
        best = torch.topk(merged, beams).indices
        kept = torch.cat((kept, candidates))[best]
        kept_scores = merged[best]
        kept_finished = torch.cat((kept_finished, ends & first_of_top))[best]
        kept_lengths = torch.cat((kept_lengths, torch.full((keep,), generated, device=device)))[best]
        alive = candidate_scores + ends.float() * -1e9
        survivors = torch.topk(alive, beams).indices
        running, running_scores = candidates[survivors], alive[survivors]
        if context is not None:
            context.swap_key_value_dict(source[survivors])
        worst = torch.where(kept_finished, kept_scores.min(), torch.tensor(-1e9, device=device))
        improvable = improvable and bool((running_scores[0] / generated ** length_penalty > worst).any())
        if not improvable or bool(ends.all()):
            break
    ids = kept[0, length: length + int(kept_lengths[0])].tolist()
    return Generated(list(prompt), ids, bool(ids) and ids[-1] in stops)
