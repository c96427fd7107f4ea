"""``--log-memory-to-tensorboard`` on every backend.

Upstream: ``megatron.training.training.training_log`` reads ``torch.cuda.memory_stats()`` for it,
which the CPU backend answers with nothing (KeyError) and an NPU run may not have. On CPU and NPU
this wrapper of ``training_log`` turns Megatron's read off for the call and writes, on the same
schedule (every ``--tensorboard-log-interval``), the figures of
:func:`adaptor.memory_stats.memory_scalars`: the host's resident memory (``mem-rss-bytes``,
``mem-max-rss-bytes``) and, on NPU, the allocator's (``mem-allocated-bytes``,
``mem-max-allocated-bytes``, ``mem-reserved-bytes``). CUDA keeps Megatron's own.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__


def _training_log(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args
    from megatron.training.global_vars import get_tensorboard_writer

    from adaptor import run_state
    from adaptor.memory_stats import memory_scalars

    run_args = get_args()
    run_args.log_memory_to_tensorboard = False
    try:
        result = wrapped(*call_args, **kwargs)
    finally:
        run_args.log_memory_to_tensorboard = True
    iteration = call_args[3] if len(call_args) > 3 else kwargs["iteration"]
    writer = get_tensorboard_writer()
    if writer and iteration % run_args.tensorboard_log_interval == 0:
        for name, value in memory_scalars(run_state.backend().device_type).items():
            writer.add_scalar(name, value, iteration)
    return result


class TensorboardMemory(Feature):
    name = "tensorboard_memory"
    backends = ("npu", "cpu")
    upstream_flags = ("--log-memory-to-tensorboard",)

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "log_memory_to_tensorboard", False))

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.training_log", _training_log, OWNER)
