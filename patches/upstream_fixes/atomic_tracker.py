"""Replace Megatron's checkpoint tracker atomically, so that a kill during a save never empties it.

Upstream: ``megatron.training.checkpointing.save_checkpoint`` ends with rank 0 opening
``latest_checkpointed_iteration.txt`` with mode ``'w'`` (which truncates it) and writing the new
iteration. A process killed in between leaves an empty tracker; ``read_metadata`` then exits with
"Invalid metadata file" and the run resumes from none of its checkpoints. The module reaches files
through ``maybe_msc``; we give it one whose ``open`` of the tracker for writing returns
:class:`adaptor.checkpoint.files.ReplacingFile` (a temporary file, fsynced, renamed over the
tracker): the tracker names the previous checkpoint or the new one. Every other call, and every
call while Megatron's multi-storage client is enabled, goes to Megatron's ``maybe_msc`` unchanged.

Remove when: ``save_checkpoint`` writes the tracker through a temporary file and a rename;
megatron-core 0.19.2 and Megatron-LM main (d98e8a64, 2026-08-22) open it in place with ``'w'``.
"""
from __future__ import annotations

import os

from adaptor.checkpoint.files import TRACKER, ReplacingFile
from adaptor.features import Feature

OWNER = __name__


class _TrackerReplacingStorage:
    """Megatron's ``maybe_msc``, but for writes of the tracker on a local file system."""

    def open(self, file, mode="r", *args, **kwargs):
        from megatron.core.msc_utils import MultiStorageClientFeature, maybe_msc

        if "w" in mode and os.path.basename(str(file)) == TRACKER and not MultiStorageClientFeature.is_enabled():
            return ReplacingFile(file)
        return maybe_msc.open(file, mode, *args, **kwargs)

    def __getattr__(self, name):
        from megatron.core.msc_utils import maybe_msc

        return getattr(maybe_msc, name)


class AtomicTracker(Feature):
    name = "atomic_tracker"

    def register_patches(self, pm, ctx) -> None:
        pm.register_replacement("megatron.training.checkpointing.maybe_msc", _TrackerReplacingStorage(), OWNER)
