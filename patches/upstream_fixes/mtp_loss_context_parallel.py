"""Multi-token prediction under context parallelism: the MTP loss is the whole sequence's mean.

Upstream: ``megatron.core.transformer.multi_token_prediction.process_mtp_loss`` divides each rank's
MTP loss by that rank's own valid-token count (from ``roll_tensor``), then ranks are averaged; under
CP only the rank with the last chunk loses a token, so the mean of means drifts from CP = 1 (8e-5
relative in ten iterations of the tiny DeepSeek-V3). The ``roll_tensor`` wrapper returns, for a
floating-point (loss-mask) tensor rolled over a CP group of several ranks, the count averaged over
the group, so the rank average is the sequence's mean; integer tensors are left alone.

Remove when: ``process_mtp_loss`` divides the MTP loss by the valid-token count of the whole
sequence (reduced over the CP group) instead of each rank's own. Not fixed as of megatron-core
0.19.2 nor on Megatron-LM main (d98e8a64, 2026-08-22), where ``roll_tensor`` still returns the local
sum; the open https://github.com/NVIDIA/Megatron-LM/pull/7498 makes that change.
"""
from __future__ import annotations

import torch

from adaptor.features import Feature

OWNER = __name__


def _roll_tensor(wrapped, instance, call_args, kwargs):
    rolled, count = wrapped(*call_args, **kwargs)
    cp_group = kwargs.get("cp_group", call_args[3] if len(call_args) > 3 else None)
    if (count is None or cp_group is None or cp_group.size() == 1
            or not torch.is_floating_point(rolled)):
        return rolled, count
    total = count.detach().clone()
    torch.distributed.all_reduce(total, group=cp_group)
    return rolled, total / cp_group.size()


class MtpLossContextParallel(Feature):
    name = "mtp_loss_context_parallel"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.core.transformer.multi_token_prediction.roll_tensor", _roll_tensor, OWNER)
