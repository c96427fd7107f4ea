"""DPO's losses in closed form, from sequence log-probabilities of the policy and the frozen reference.

With ``h = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected)``:

* ``sigmoid`` (DPO): ``-(1 - eps) * log sigmoid(beta h) - eps * log sigmoid(-beta h)``, ``eps`` the label
  smoothing (conservative DPO: a share ``eps`` of the pairs is assumed mislabelled);
* ``hinge`` (SLiC): ``relu(1 - beta h)``;
* ``ipo``: ``(h - 1 / (2 beta))^2``. IPO regresses the margin to a fixed target, so its log-probabilities
  are per-token means (:func:`sequence_logps` with ``average=True``) rather than sums, as the common DPO
  trainers do; otherwise the target would depend on the responses' lengths.

The implicit rewards ``beta * (policy - reference)`` of each response are what the run logs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

LOSS_TYPES = ("sigmoid", "hinge", "ipo")


def averages_logps(loss_type: str) -> bool:
    """Whether ``loss_type`` takes per-token mean log-probabilities instead of sums."""
    return loss_type == "ipo"


def sequence_logps(token_logps: torch.Tensor, loss_mask: torch.Tensor, average: bool = False,
                   group=None, slots: torch.Tensor | None = None, num_slots: int | None = None) -> torch.Tensor:
    """Sum (or mean) of ``token_logps`` over the response tokens ``loss_mask`` marks: per row ([rows] from
    [rows, s]), or with ``slots`` (each token's sequence, any layout: rows, packed rows, a THD stream)
    per sequence ([num_slots]).

    ``group``: the context-parallel group when each rank holds a share of every sequence's tokens. The
    sums are added over it with an all-reduce whose backward adds the ranks' gradients too: every rank then
    computes the same loss, each gradient reaches the tokens of every rank, and Megatron's reduction over
    the data- and context-parallel ranks (sum, divided by their number) gives the gradient of one loss."""
    mask = loss_mask.float()
    if slots is None:
        total, count = (token_logps.float() * mask).sum(-1), mask.sum(-1)
    else:  # added one by one, so in float64: float32 would lose ~1e-6 of a sum of ~100 values
        where = slots.reshape(-1).long()
        zeros = torch.zeros(num_slots, dtype=torch.float64, device=token_logps.device)
        total = zeros.index_add(0, where, (token_logps.double() * mask.double()).reshape(-1)).float()
        count = zeros.index_add(0, where, mask.double().reshape(-1)).float()
    if group is not None:
        from torch.distributed.nn.functional import all_reduce

        total = all_reduce(total, group=group)
    if not average:
        return total
    if group is not None:
        torch.distributed.all_reduce(count, group=group)
    return total / count.clamp(min=1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, reference_chosen: torch.Tensor,
             reference_rejected: torch.Tensor, beta: float, loss_type: str = "sigmoid",
             label_smoothing: float = 0.0):
    """Per-pair losses [b], and the chosen and rejected rewards [b] (detached)."""
    h = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected)
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * h)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss type {loss_type!r} (known: {', '.join(LOSS_TYPES)})")
    chosen_rewards = beta * (policy_chosen - reference_chosen).detach()
    rejected_rewards = beta * (policy_rejected - reference_rejected).detach()
    return losses, chosen_rewards, rejected_rewards
