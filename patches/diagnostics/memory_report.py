"""``ADAPTOR_REPORT_MEMORY=1``: each rank prints the model state it holds and its peak memory.

Upstream functions wrapped (only when the variable is set):

* ``megatron.training.training.train_step``: after the first step, when the optimizer state
  exists, each rank prints one line with the bytes of parameters, gradients and optimizer state
  it holds (:func:`adaptor.memory_stats.model_state_bytes`: local shards for FSDP2, whole
  tensors for DDP);
* ``megatron.training.training.train``: at the end, each rank prints its peak resident memory
  and, on CUDA or NPU, the allocator's peak.

Megatron's own ``--log-memory-to-tensorboard`` and memory report read the CUDA allocator only,
which says nothing on CPU and nothing about how the state is split across ranks; the FSDP2
tests and ``benchmarks/fsdp2_memory.py`` read these lines.
"""
from __future__ import annotations


from adaptor import env
from adaptor.features import Feature
from adaptor.log import every_rank

OWNER = __name__
ENV = "ADAPTOR_REPORT_MEMORY"
_reported = {"state": False}


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _train_step(wrapped, instance, call_args, kwargs):
    result = wrapped(*call_args, **kwargs)
    if not _reported["state"]:
        _reported["state"] = True
        from adaptor.memory_stats import model_state_bytes

        model = call_args[2] if len(call_args) > 2 else kwargs["model"]
        optimizer = call_args[3] if len(call_args) > 3 else kwargs["optimizer"]
        counts = model_state_bytes(model, optimizer)
        parts = ", ".join(f"{key} {value}" for key, value in counts.items())
        every_rank(f"model state rank {_rank()}: {parts}, total {sum(counts.values())} bytes")
    return result


def _train(wrapped, instance, call_args, kwargs):
    result = wrapped(*call_args, **kwargs)
    from adaptor import run_state
    from adaptor.memory_stats import device_peak_mib, peak_rss_mib

    line = f"peak memory rank {_rank()}: RSS {peak_rss_mib():.1f} MiB"
    device = device_peak_mib(run_state.backend().device_type)
    if device is not None:
        line += f", {run_state.backend().device_type} allocated {device:.1f} MiB"
    every_rank(line)
    return result


class MemoryReport(Feature):
    name = "memory_report"

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and env.is_on(ENV)

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.train_step", _train_step, OWNER)
        pm.register_wrapper("megatron.training.training.train", _train, OWNER)
