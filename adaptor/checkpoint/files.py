"""Where a safetensors checkpoint's files live, and how a directory becomes complete atomically.

Layout of one checkpoint (Megatron's ``<save>/iter_0000100/``; the tracker file
``latest_checkpointed_iteration.txt`` beside it stays Megatron's):

* ``metadata.json`` — Megatron's distributed-checkpoint marker, ``{"sharded_backend": "safetensors", ...}``;
  written last, so a directory without it was never finished;
* ``common.json`` (+ ``common.safetensors`` when the common state holds tensors) — what every rank
  shares: iteration, arguments, scheduler, optimizer hyper-parameters, the parallel layout and
  the list of rank files;
* ``rank_00000.safetensors`` ... — the tensors and objects each rank owns, with every tensor's key,
  global shape and slice in the file's ``__metadata__``.

Writes go to ``.iter_0000100.partial/``; once every rank has fsynced, rank 0 writes the marker and
renames it into place (an older one moved aside, then deleted), so a killed run leaves the old or the
new checkpoint, never a mixture. :func:`staged_directory` does the same for directories written whole
(merged/split checkpoints, HF directories, PEFT adapters).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from adaptor.checkpoint.errors import CheckpointError


def fsync_dir(path) -> None:
    """Make a rename or a new entry in ``path`` durable (no-op where directories cannot be opened).

    A failed fsync raises :class:`CheckpointError`: the entry may not survive a crash, so the save fails
    and the tracker keeps naming the previous checkpoint."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        raise CheckpointError(f"cannot make {path} durable: fsync failed ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)


TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's: the iteration a resume loads
BACKEND = "safetensors"
BACKEND_VERSION = 1
MARKER = "metadata.json"
COMMON_JSON = "common.json"
COMMON_TENSORS = "common.safetensors"
FORMAT_NAME = "megatron-adaptor-safetensors"
_RANK_FILE = re.compile(r"rank_(\d{5,})\.safetensors")


def tracked_dir_name(text: str) -> str | None:
    """The directory a tracker's text names (``"100"`` -> ``iter_0000100``, ``"release"``); None for anything else."""
    text = text.strip()
    if text == "release":
        return "release"
    return f"iter_{int(text):07d}" if text.isdigit() else None


def rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


def staging_dir(checkpoint_dir) -> Path:
    checkpoint_dir = Path(checkpoint_dir)
    return checkpoint_dir.with_name(f".{checkpoint_dir.name}.partial")


def is_safetensors_checkpoint(checkpoint_dir) -> bool:
    """True for a finished checkpoint of this format (its marker names our backend)."""
    marker = Path(checkpoint_dir) / MARKER
    try:
        return json.loads(marker.read_text()).get("sharded_backend") == BACKEND
    except (OSError, ValueError, AttributeError):
        return False


def member(checkpoint_dir, name) -> Path:
    """``checkpoint_dir/name`` for a plain file name a checkpoint's metadata gave; anything else is refused.

    Metadata is data from disk: a name with a separator, ``..``, or a link that leads outside
    the directory must not make the loader open files elsewhere.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise CheckpointError(f"{checkpoint_dir / COMMON_JSON}: names a file outside the checkpoint "
                              f"directory ({name!r}); refusing to read it")
    path = checkpoint_dir / name
    if path.is_symlink() and not path.resolve().is_relative_to(checkpoint_dir.resolve()):
        raise CheckpointError(f"{path}: a link to {path.resolve()}, outside the checkpoint directory; refusing to read it")
    return path


def is_rank_file(name: str) -> bool:
    return _RANK_FILE.fullmatch(name) is not None


def prepare_staging(checkpoint_dir) -> Path:
    """Rank 0, before anyone writes: an empty staging directory (leftovers of a killed save are removed)."""
    staging = staging_dir(checkpoint_dir)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def discard_staging(checkpoint_dir) -> None:
    """Rank 0, after a failed save: the staging directory goes, and so does the final directory if empty.

    Megatron's rank 0 creates ``iter_N/`` before the save; left empty it would look like a
    checkpoint directory. A non-empty one (an older save of the same iteration) is kept.
    """
    shutil.rmtree(staging_dir(checkpoint_dir), ignore_errors=True)
    final = Path(checkpoint_dir)
    try:
        final.rmdir()
    except OSError:
        pass


class ReplacingFile:
    """A text file written under a hidden temporary name and renamed over ``path`` when closed without
    an error: a reader, or a process killed meanwhile, finds the old content or the new, never a part."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp")
        self._file = open(self._tmp, "w")

    def write(self, text: str) -> int:
        return self._file.write(text)

    def close(self, keep: bool = True) -> None:
        if self._file.closed:
            return
        if keep:
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()
        if keep:
            os.replace(self._tmp, self.path)
            fsync_dir(self.path.parent)
        else:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> ReplacingFile:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(keep=exc_type is None)


def write_json(path: Path, doc: dict, **dump_kwargs) -> None:
    """Write a JSON document durably in place of ``path`` (:class:`ReplacingFile`)."""
    with ReplacingFile(path) as out:
        json.dump(doc, out, **dump_kwargs)


def commit(checkpoint_dir) -> None:
    """Rank 0, after every rank's files are durable: marker, then rename the staging directory into place."""
    final = Path(checkpoint_dir)
    staging = staging_dir(final)
    write_json(staging / MARKER, {"sharded_backend": BACKEND, "sharded_backend_version": BACKEND_VERSION})
    fsync_dir(staging)
    old = None
    if final.exists() or final.is_symlink():
        # Megatron's rank 0 creates the (empty) directory before saving; it may also be an older
        # save of the same iteration. Move it aside so the rename below is a single atomic step.
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(staging, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() and not old.is_symlink() else old.unlink()


def refuse_nonempty(target, flag: str = "--save-dir", error=CheckpointError) -> None:
    target = Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise error(f"{flag} {target} exists and is not empty (refusing to overwrite)")


@contextlib.contextmanager
def staged_directory(target, flag: str = "--save-dir", error=CheckpointError) -> Iterator[Path]:
    """Write the directory ``target`` (new, or empty) all or nothing: yields an empty hidden sibling to fill,
    renamed onto ``target`` when the block ends, deleted if it raises. A non-empty ``target`` is refused
    (``error``, naming ``flag``) first, and again before the rename: the write may have taken a while."""
    target = Path(target)
    refuse_nonempty(target, flag, error)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        yield temp
        refuse_nonempty(target, flag, error)
        if target.exists():
            target.rmdir()
        temp.rename(target)
        fsync_dir(target.parent)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
