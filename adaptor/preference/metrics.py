"""What a DPO micro-batch reports to Megatron's loss dict: each value a [sum, count] pair.

Megatron's training step adds such pairs over micro-batches and data-parallel ranks before it divides,
so the logged value (and TensorBoard's) is the mean over every pair of the global batch, whatever the
layout."""
from __future__ import annotations

import torch


def dpo_report(losses: torch.Tensor, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
               sft_losses: torch.Tensor | None = None) -> dict:
    """``{"dpo loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"}`` (and
    ``"sft loss"`` with ``--pref-ftx``), each ``[sum over the micro-batch's pairs, pairs]``."""
    count = torch.tensor(float(losses.numel()), device=losses.device)
    values = {
        "dpo loss": losses.detach(),
        "rewards/chosen": chosen_rewards,
        "rewards/rejected": rejected_rewards,
        "rewards/margins": chosen_rewards - rejected_rewards,
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float(),
    }
    if sft_losses is not None:
        values["sft loss"] = sft_losses.detach()
    return {name: torch.stack([v.float().sum(), count]) for name, v in values.items()}
