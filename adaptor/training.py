"""Pieces the entry files (``pretrain_gpt.py``, ``pretrain_mm.py``) share with Megatron's loop."""
from __future__ import annotations

import torch


def masked_lm_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Sum of per-token losses under ``loss_mask``, the token count, and the logged ``lm loss``.

    Megatron's schedule divides the sum by the count (``calculate_per_token_loss`` or not), which
    is why the sum and the count are returned separately. With ``--check-for-nan-in-loss-and-grad``
    a NaN or Inf loss stops the run through Megatron's rerun state machine, as in Megatron-LM.
    """
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.training import get_args

    losses = output_tensor.reshape(-1).float()
    loss_mask = loss_mask.reshape(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    if get_args().check_for_nan_in_loss_and_grad:
        rerun = get_rerun_state_machine()
        for reject, what in ((torch.isnan, "NaN"), (torch.isinf, "Inf")):
            rerun.validate_result(result=loss, rejection_func=reject, tolerance=0.0, fatal=True,
                                  message=f"found {what} in local forward loss calculation")
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}
