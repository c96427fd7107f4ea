"""Stage host tensors of an asynchronous torch_dist save by copying them, as device tensors are.

Upstream: ``megatron.core.dist_checkpointing.strategies.filesystem_async.FileSystemWriterAsync``.
Its ``get_save_function_and_args`` hands the async caller a staging function, ``preload_tensors``,
that copies every tensor to host memory with ``tensor.to("cpu")``; the trainer waits for that copy
and then trains on while the writer writes the copies. A tensor already on the host is not copied
(``to`` returns the tensor itself), and ``prepare_write_data`` clones host tensors only when they
are views. So on a CPU (or any host-resident state, such as offloaded optimizer state) the writer
holds the live parameters and Adam moments: the persistent worker receives them through a queue that
moves their storage to shared memory in place, and the next optimizer step changes them while they
are written. A resume from such a checkpoint then takes a few moments of step N+1, and its curve
leaves the original one at the second iteration after the load.

We give the caller a staging function that clones host tensors and leaves the device ones to
upstream's copy. The cost is the same one host copy of the state that a GPU run makes; a
synchronous save stages through the same function, as upstream's does.

Remove when: ``preload_tensors`` (or ``prepare_write_data``) copies host tensors for asynchronous
saves; megatron-core 0.19.2 and Megatron-LM main (d98e8a64, 2026-08-22) leave them shared, with a
TODO in ``_clone_or_dequantize_if_needed`` saying the persistent worker should get its own copies.
No upstream issue or PR found.
"""
from __future__ import annotations

from functools import partial

from adaptor.features import Feature

OWNER = __name__


def stage_a_snapshot(write_buckets, non_blocking=True):
    """Upstream's staging, after replacing each host tensor by a copy the trainer cannot change."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    copied = [
        (file_name, storage_key, (bytes_data, [(item, t.clone() if t.device.type == "cpu" else t)
                                               for item, t in tensor_data]))
        for file_name, storage_key, (bytes_data, tensor_data) in write_buckets
    ]
    return FileSystemWriterAsync.preload_tensors(copied, non_blocking)


def _with_snapshot_staging(wrapped, instance, call_args, kwargs):
    save_fn, preload_fn, save_args = wrapped(*call_args, **kwargs)
    if preload_fn is not None:
        # a module-level function, so that the persistent worker can unpickle it by name
        preload_fn = partial(stage_a_snapshot, *preload_fn.args, **preload_fn.keywords)
    return save_fn, preload_fn, save_args


class AsyncSaveHostSnapshot(Feature):
    name = "async_save_host_snapshot"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(
            "megatron.core.dist_checkpointing.strategies.filesystem_async.FileSystemWriterAsync"
            ".get_save_function_and_args", _with_snapshot_staging, OWNER)
