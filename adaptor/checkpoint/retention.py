"""``--keep-checkpoint-max``: delete the oldest finished checkpoints beyond N, only after a newer one is complete.

Runs on rank 0 after the tracker file names the new checkpoint (for async saves: as the last
finalize step, after Megatron's own). Checkpoints at multiples of Megatron's
``--save-retain-interval`` are kept permanently and do not count towards N. A directory is
renamed to a hidden name before it is deleted, so an interrupted deletion never leaves
something that looks like a checkpoint. Leftover staging directories of saves that were
killed (older than the newest finished checkpoint) are removed too.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from adaptor.checkpoint import files

_ITER_DIR = re.compile(r"iter_(\d{7,})")
_PARTIAL_DIR = re.compile(r"\.iter_(\d{7,})\.partial")


def finished_iterations(save_dir) -> list[int]:
    """Iterations of the complete safetensors checkpoints under ``save_dir``, oldest first."""
    found = []
    for entry in Path(save_dir).iterdir():
        match = _ITER_DIR.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and files.is_safetensors_checkpoint(entry):
            found.append(int(match.group(1)))
    return sorted(found)


def prune(save_dir, keep_max: int, retain_interval: int | None = None, log=print) -> list[int]:
    """Delete all but the ``keep_max`` newest finished checkpoints; returns the deleted iterations."""
    save_dir = Path(save_dir)
    finished = finished_iterations(save_dir)
    if not finished:
        return []
    counted = [it for it in finished if not (retain_interval and it % retain_interval == 0)]
    doomed = counted[:-keep_max] if keep_max > 0 else []
    for iteration in doomed:
        path = save_dir / f"iter_{iteration:07d}"
        hidden = save_dir / f".{path.name}.deleting-{os.getpid()}"
        os.replace(path, hidden)
        shutil.rmtree(hidden, ignore_errors=True)
    if doomed:
        log(f"[megatron-adaptor] --keep-checkpoint-max {keep_max}: deleted checkpoint(s) at iteration "
            f"{', '.join(map(str, doomed))} under {save_dir}")
    newest = finished[-1]
    for entry in save_dir.iterdir():
        match = _PARTIAL_DIR.fullmatch(entry.name)
        if match and int(match.group(1)) <= newest:
            shutil.rmtree(entry, ignore_errors=True)
    return doomed
