"""Start the queue that collects a torch_dist save's write results by fork, not spawn.

Upstream: ``megatron.core.dist_checkpointing.strategies.filesystem_async.get_write_results_queue``
creates, on the first ``--ckpt-format torch_dist`` save of a process, a ``multiprocessing`` manager
whose only job is to hold a queue. Its default context is ``spawn``, and a spawned process imports
the training script again (``pretrain_gpt.py``, hence torch, megatron and this adaptor) before it
serves anything: the first save of every run waited 7 to 14 s for it on a 2-core CPU, the following
ones 0.2 s. Megatron's persistent checkpoint worker already asks for ``mp_mode="fork"`` here
(``megatron.training.async_utils.init_persistent_async_worker``), and the writer processes of the
same save are forked too, so we make ``fork`` the default for the calls that give no mode. The
manager's child serves a queue and touches no device.

Remove when: ``FileSystemWriterAsync.prepare_write_data`` asks for a forked (or otherwise cheap)
results queue; megatron-core 0.19.2 and Megatron-LM main (d98e8a64, 2026-08-22) call
``get_write_results_queue()`` with its ``spawn`` default. No upstream issue or PR found.
"""
from __future__ import annotations

import sys

from adaptor.features import Feature

OWNER = __name__


def _forked_by_default(wrapped, instance, call_args, kwargs):
    if not call_args and "mp_mode" not in kwargs:
        kwargs = {**kwargs, "mp_mode": "fork"}
    return wrapped(*call_args, **kwargs)


class CheckpointResultsQueue(Feature):
    name = "checkpoint_results_queue"

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and sys.platform.startswith("linux")  # fork is the Linux default

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(
            "megatron.core.dist_checkpointing.strategies.filesystem_async.get_write_results_queue",
            _forked_by_default, OWNER)
