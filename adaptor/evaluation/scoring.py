"""Log-probabilities of token sequences from the Megatron model, on every rank.

lm-eval asks for the log-likelihood of a continuation given a context. The whole sequence goes
through the model once (Megatron's forward-only schedule, so TP and PP work as in training); the last
pipeline stage turns the gathered logits into log-probabilities over the tokenizer's vocabulary (the
embedding's padding rows are left out, as a Hugging Face model of the same tokenizer has none) and
keeps, at each position, the log-probability of the next token and whether it was the argmax. Those
two rows are broadcast over the pipeline group, so every rank holds the same answer and lm-eval can run
unchanged on each of them.

Rows of different lengths share a batch right-padded: attention is causal, so padding after a row's
last token cannot change what the row's own positions see.
"""
from __future__ import annotations

import torch

from adaptor.inference import forward_logits, from_last_stage


@torch.no_grad()
def next_token_scores(model, rows: list[list[int]], vocab_size: int) -> list[tuple[list[float], list[bool]]]:
    """For each row of token ids: the log-probability of token ``i + 1`` given tokens ``0..i`` and whether
    it was the most likely token, for ``i`` in ``0 .. len(row) - 2``. Every rank gets the same lists."""
    device = next(model[0].parameters()).device
    batch, total = len(rows), max(len(r) for r in rows)
    tokens = torch.zeros((batch, total), dtype=torch.int64, device=device)
    for i, ids in enumerate(rows):
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    positions = torch.arange(total, device=device).unsqueeze(0).expand(batch, -1)
    causal = torch.triu(torch.ones(total, total, dtype=torch.bool, device=device), diagonal=1)[None, None]
    logits = forward_logits(model, tokens, positions, causal)
    scores = None
    if logits is not None:
        logprobs = torch.log_softmax(logits[:, :-1, :vocab_size].float(), dim=-1)
        targets = tokens[:, 1:]
        picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        greedy = (logprobs.argmax(dim=-1) == targets).to(torch.float32)
        scores = torch.stack([picked, greedy])
    scores = from_last_stage(scores, (2, batch, total - 1), torch.float32, device)
    scores = scores.cpu()
    out = []
    for i, ids in enumerate(rows):
        n = len(ids) - 1
        out.append((scores[0, i, :n].tolist(), [bool(g) for g in scores[1, i, :n].tolist()]))
    return out
