"""Directories a run will write into: usable now, not at the first save an hour from now.

Upstream creates ``--save``'s iteration directory only when it first saves, so ``--save``
pointing at a regular file (or a read-only mount) trains the whole first save interval and
then dies with ``NotADirectoryError``; ``--tensorboard-dir`` and ``--data-cache-path`` fail
the same way at their first write. Here each directory must exist and be a writable
directory, or be creatable: its nearest existing ancestor is a writable directory. Nothing
is created by the check itself (a run that fails for another reason leaves no trace).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from adaptor.errors import ArgumentError

#: (dest, flag) of every directory a training run writes into
OUTPUT_DIRS = (("save", "--save"), ("data_cache_path", "--data-cache-path"), ("tensorboard_dir", "--tensorboard-dir"),
               ("wandb_save_dir", "--wandb-save-dir"), ("hf_save_dir", "--hf-save-dir"))


def check_output_dirs(args) -> None:
    """Raise ArgumentError for the first output directory of ``args`` that cannot be written."""
    for dest, flag in OUTPUT_DIRS:
        path = getattr(args, dest, None)
        if path:
            check_writable_dir(path, flag)


def nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path):
        path = path.parent
    return path


def check_writable_dir(path: str, flag: str) -> None:
    """Raise ArgumentError unless ``path`` is, or can become, a directory this process may write into."""
    target = Path(os.path.abspath(os.path.expanduser(path)))
    existing = nearest_existing(target)
    if existing.is_symlink() and not existing.exists():
        raise ArgumentError(f"{flag} {path}: {existing} is a link to {os.readlink(existing)}, which does not exist")
    if not existing.is_dir():
        what = "is a regular file" if existing.is_file() else "is not a directory"
        where = "" if existing == target else f" ({existing} {what}, so the directory cannot be created)"
        raise ArgumentError(f"{flag} {path}: {what if existing == target else 'cannot be created'}{where}; "
                            f"point it at a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        own = "" if existing == target else f" (nor can it be created: {existing} is not writable)"
        raise ArgumentError(f"{flag} {path}: this process (uid {os.getuid()}) may not write into "
                            f"{existing}{own}; check the permissions or the mount")


def free_bytes(path: str) -> int:
    return shutil.disk_usage(nearest_existing(Path(path))).free


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def check_free_space(path: str, flag: str, need: int, what: str, override: str) -> None:
    free = free_bytes(path)
    if free < need:
        raise ArgumentError(f"{flag} {path}: {human(free)} free on its filesystem, but {what} needs about "
                            f"{human(need)}; free space, point {flag} elsewhere, or pass {override} to skip this check")
