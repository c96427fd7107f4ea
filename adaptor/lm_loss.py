"""The language-model loss the entry files (``pretrain_gpt.py``, ``pretrain_mm.py``) hand to Megatron's loop."""
from __future__ import annotations

import torch


def masked_lm_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Sum of per-token losses under ``loss_mask``, the token count, and the logged ``lm loss``.

    Megatron's schedule divides the sum by the count (``calculate_per_token_loss`` or not), which
    is why the sum and the count are returned separately. With ``--check-for-nan-in-loss-and-grad``
    a NaN or Inf loss stops the run through Megatron's rerun state machine, as in Megatron-LM.

    Context parallelism: without ``--calculate-per-token-loss`` the schedule divides each CP rank's
    sum by that rank's own count, and gradients are then averaged over the CP ranks: the mean of
    per-rank means, which is the sequence's mean only when every rank holds as many loss tokens.
    Padded packed documents and ``--eod-mask-loss`` break that, so the sum used for the backward is
    rescaled by (rank count x CP / sequence count): the gradient is the whole sequence's mean again.
    The logged loss is unchanged, and with balanced ranks the factor is exactly 1.
    """
    from megatron.core import mpu
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.training import get_args

    args = get_args()
    losses = output_tensor.reshape(-1).float()
    loss_mask = loss_mask.reshape(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    if args.check_for_nan_in_loss_and_grad:
        rerun = get_rerun_state_machine()
        for reject, what in ((torch.isnan, "NaN"), (torch.isinf, "Inf")):
            rerun.validate_result(result=loss, rejection_func=reject, tolerance=0.0, fatal=True,
                                  message=f"found {what} in local forward loss calculation")
    report = {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}
    cp = mpu.get_context_parallel_world_size()
    if cp > 1 and not args.calculate_per_token_loss:
        total = num_tokens.clone()
        torch.distributed.all_reduce(total, group=mpu.get_context_parallel_group())
        loss = loss * (num_tokens.float() * cp / total.clamp(min=1).float())
    return loss, num_tokens, report
