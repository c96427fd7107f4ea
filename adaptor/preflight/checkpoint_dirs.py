"""A ``--load`` directory checked before the model is built: tracker, iteration directory, files.

Upstream (``megatron.training.checkpointing``) reads the tracker
``latest_checkpointed_iteration.txt`` after the model and optimizer exist; garbage in it
prints "ERROR: Invalid metadata file ... Exiting" and exits with status 0, a tracker naming
an iteration whose directory is gone ends in a traceback, and a torch-format file cut short
surfaces as "could not load the checkpoint" and status 0 again. Here, for each format
Megatron or this adaptor writes, the files the load will open are checked from their
headers: the tracker's content, the iteration directory, and

* ``torch``: every ``mp_rank_*/model_optim_rng.pt`` is a complete zip archive (the
  container ``torch.save`` writes; a copy cut short has no central directory);
* ``torch_dist``: ``metadata.json`` parses and torch.distributed.checkpoint's ``.metadata``
  and data files (``*.distcp``) exist;
* ``torch_dcp`` (no ``metadata.json``, Megatron tells it by its ``.metadata``): the data files exist;
* ``safetensors``: ``common.json`` parses and every rank file it lists has a header whose
  tensors lie inside the file.
"""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from adaptor.checkpoint.files import TRACKER, tracked_dir_name
from adaptor.errors import ArgumentError



def iteration_dir(load: Path, flag: str) -> Path | None:
    """The directory the tracker in ``load`` names; None when there is no tracker (nothing to resume)."""
    tracker = load / TRACKER
    if not tracker.exists():
        return None
    try:
        text = tracker.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ArgumentError(f"{flag} {load}: cannot read {tracker}: {getattr(exc, 'strerror', None) or exc}") from None
    name = tracked_dir_name(text)
    if name is None:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ArgumentError(f"{flag} {load}: {tracker} holds {shown!r}, not an iteration number or 'release'; "
                            f"write the iteration of the checkpoint to resume (one of the iter_* directories)")
    directory = load / name
    if not directory.is_dir():
        present = sorted(p.name for p in load.glob("iter_*") if p.is_dir())
        hint = f"; present: {', '.join(present[-3:])}" if present else "; there are no iter_* directories"
        raise ArgumentError(f"{flag} {load}: {tracker} names {name}, which does not exist{hint}")
    return directory


def _check_torch(directory: Path, flag: str) -> None:
    files = sorted(directory.glob("mp_rank_*/*.pt")) + sorted(directory.glob("mp_rank_*/*/*.pt"))
    if not files:
        raise ArgumentError(f"{flag}: {directory} has no mp_rank_*/model_optim_rng.pt (not a --ckpt-format torch "
                            f"checkpoint, or an incomplete copy)")
    for path in files:
        if not zipfile.is_zipfile(path):
            raise ArgumentError(f"{flag}: {path} is not a complete torch checkpoint file ({path.stat().st_size} bytes, "
                                f"no zip directory at its end): a copy cut short or a save that did not finish")


def _check_dcp(directory: Path, flag: str, fmt: str = "torch_dist") -> None:
    # megatron-core 0.19.2 keeps the common state in the .distcp files too; common.pt is optional.
    if not (directory / ".metadata").is_file():
        raise ArgumentError(f"{flag}: {directory} has no .metadata; this {fmt} checkpoint is incomplete")
    if not any(directory.glob("*.distcp")):
        raise ArgumentError(f"{flag}: {directory} has no *.distcp files; this {fmt} checkpoint is incomplete")


def _check_safetensors(directory: Path, flag: str) -> None:
    from adaptor.checkpoint import files
    from adaptor.safetensors_header import SafetensorsError, read_header

    common = directory / files.COMMON_JSON
    try:
        doc = json.loads(common.read_text())
    except OSError as exc:
        raise ArgumentError(f"{flag}: cannot read {common}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ArgumentError(f"{flag}: {common} is not valid JSON ({exc})") from None
    names = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(names, list) or not names:
        raise ArgumentError(f"{flag}: {common} lists no rank files")
    for name in names:
        try:
            path = files.member(directory, name)
        except Exception as exc:  # CheckpointError: a name that leaves the directory
            raise ArgumentError(f"{flag}: {exc}") from None
        if not path.is_file():
            raise ArgumentError(f"{flag}: {path} is missing ({common} lists it)")
        try:
            read_header(path)
        except SafetensorsError as exc:
            raise ArgumentError(f"{flag}: {exc}") from None


def sharded_backend(directory: Path, flag: str) -> str | None:
    marker = directory / "metadata.json"
    if not marker.exists():
        return None
    try:
        doc = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"{flag}: {marker} is not valid JSON ({exc})") from None
    backend = doc.get("sharded_backend") if isinstance(doc, dict) else None
    if not isinstance(backend, str):
        raise ArgumentError(f"{flag}: {marker} names no sharded_backend; the checkpoint is damaged")
    return backend


def check_load_dir(path: str, flag: str, required: str | None = None) -> str | None:
    """Raise ArgumentError if ``path`` holds a checkpoint a load would fail on; else return its format.

    ``required``: why a checkpoint must be there (None: a missing one means "start from scratch").
    The format is Megatron's name for what ``_get_checkpoint_format`` would find (``torch_dcp`` for a
    bare DCP directory, which is also what fsdp_dtensor saves), or None where there is nothing to load.
    """
    load = Path(os.path.expanduser(path))
    if not load.exists():
        if required:
            raise ArgumentError(f"{flag} {path}: does not exist, and {required}")
        return None  # Megatron starts from scratch (the usual first run of --load = --save)
    if not load.is_dir():
        raise ArgumentError(f"{flag} {path}: is not a directory")
    if not os.access(load, os.R_OK | os.X_OK):
        raise ArgumentError(f"{flag} {path}: this process may not read it")
    backend = sharded_backend(load, flag)
    directory = load if backend is not None or any(load.glob("mp_rank_*")) else iteration_dir(load, flag)
    if directory is None:
        if required:
            raise ArgumentError(f"{flag} {path}: has no {TRACKER} (no checkpoint to load), and {required}")
        return None
    backend = sharded_backend(directory, flag)
    if backend is None and (directory / ".metadata").exists():
        _check_dcp(directory, flag, "torch_dcp")  # how Megatron's _get_checkpoint_format tells torch_dcp
        return "torch_dcp"
    if backend is None:
        _check_torch(directory, flag)
        return "torch"
    if backend == "safetensors":
        _check_safetensors(directory, flag)
    elif backend == "torch_dist":
        _check_dcp(directory, flag)
    return backend


def check_load_inputs(args) -> None:
    """Raise ArgumentError for a ``--load`` or ``--pretrained-checkpoint`` that cannot be read."""
    exit_on_missing = "--exit-on-missing-checkpoint is set" if getattr(args, "exit_on_missing_checkpoint", False) \
        else None
    found = []
    if getattr(args, "load", None):
        found.append(("--load", args.load, check_load_dir(args.load, "--load", exit_on_missing)))
    if getattr(args, "pretrained_checkpoint", None):
        found.append(("--pretrained-checkpoint", args.pretrained_checkpoint,
                      check_load_dir(args.pretrained_checkpoint, "--pretrained-checkpoint", "the run starts from it")))
    for flag, path, fmt in found:
        if getattr(args, "use_megatron_fsdp", False) and fmt not in (None, "torch_dcp"):
            raise ArgumentError(
                f"{flag} {path}: a {fmt} checkpoint, and Megatron-FSDP (--use-megatron-fsdp) loads only its own "
                "--ckpt-format fsdp_dtensor checkpoints in megatron-core 0.19.2; load it without "
                "--use-megatron-fsdp (--use-torch-fsdp2 loads torch_dist and safetensors)")
