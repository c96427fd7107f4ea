"""Reset the loss accumulators after the first logged iteration when it is a scheduled log point.

Upstream: ``megatron.training.training.training_log`` always prints the first iteration but does not
reset its accumulators then; when that iteration is also a scheduled print (``--log-interval 1``, or a
resume on a multiple of the interval) the next print averages two iterations, so a resumed run's loss
differs from the uninterrupted run's. We pass ``is_first_iteration=False`` in exactly that case.

Remove when: ``training_log`` resets its accumulators after a first iteration that falls on a log
boundary (``iteration % log_interval == 0``). https://github.com/NVIDIA/Megatron-LM/pull/7092 does
that and is marked merged, later than Megatron-LM main (d98e8a64, 2026-08-22), which still sets
``should_reset = not is_first_iteration``; it is not in megatron-core 0.19.2 and no release
containing it has been established. The open https://github.com/NVIDIA/Megatron-LM/pull/6881 covers
``--log-interval 1`` only, not a resume on a boundary.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__


def _training_log(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    iteration = kwargs.get("iteration", call_args[3] if len(call_args) > 3 else None)
    if kwargs.get("is_first_iteration") and iteration is not None and iteration % get_args().log_interval == 0:
        kwargs = dict(kwargs, is_first_iteration=False)
    return wrapped(*call_args, **kwargs)


class FirstIterationLog(Feature):
    name = "first_iteration_log"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.training_log", _training_log, OWNER)
