"""The directories ``tools/safetensors_ckpt.py`` reads and writes, checked without torch.

Which checkpoint a --load-dir names, the description a merged directory carries, and a --save-dir
that is written under a hidden name and renamed when complete. Apart from :mod:`adaptor.checkpoint.unified`
so that the tool reports a wrong --load-dir or a non-empty --save-dir before importing torch.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from adaptor.checkpoint import files
from adaptor.checkpoint.errors import CheckpointError

SIDE_FILE = "megatron_checkpoint.json"  # a merged directory's description (iteration, layout, name -> key)


def resolve(path) -> Path:
    """A checkpoint directory from ``path``: an iteration directory, or a --save directory with a tracker."""
    path = Path(path)
    if files.is_safetensors_checkpoint(path):
        return path
    tracker = path / files.TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        name = files.tracked_dir_name(text)
        if name is None:
            raise CheckpointError(f"{tracker}: does not name an iteration ({text!r})")
        if files.is_safetensors_checkpoint(path / name):
            return path / name
        raise CheckpointError(f"{path / name}: not a safetensors checkpoint (named by {tracker})")
    raise CheckpointError(f"{path}: neither a safetensors checkpoint nor a --save directory with {files.TRACKER}")


def read_side_file(unified_dir) -> dict:
    """The description of a Megatron-named merged directory (what split reads back)."""
    side_path = Path(unified_dir) / SIDE_FILE
    try:
        side = json.loads(side_path.read_text())
        if side.get("names") != "megatron":
            raise ValueError("it was merged with Hugging Face names; load those with --hf-load-dir "
                             "or tools/convert_ckpt.py")
        if not isinstance(side.get("tensors"), dict):
            raise TypeError("lists no tensors")
    except FileNotFoundError:
        raise CheckpointError(f"{side_path}: missing (not a directory written by safetensors_ckpt.py merge)") from None
    except (AttributeError, TypeError, ValueError) as exc:  # not JSON, not an object, not ours
        raise CheckpointError(f"{side_path}: {exc}") from None
    return side


def refuse_nonempty(save_dir: Path) -> None:
    if save_dir.exists() and (not save_dir.is_dir() or any(save_dir.iterdir())):
        raise CheckpointError(f"--save-dir {save_dir} exists and is not empty (refusing to overwrite)")


def partial_dir(save_dir: Path) -> Path:
    """An empty hidden directory beside ``save_dir`` to write into; :func:`publish` puts it in place."""
    refuse_nonempty(save_dir)
    save_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = save_dir.with_name(f".{save_dir.name}.partial")
    if temp.exists():
        shutil.rmtree(temp)
    temp.mkdir()
    return temp


def publish(temp: Path, save_dir: Path) -> None:
    """Rename a finished directory onto ``save_dir`` (which may exist, empty)."""
    if save_dir.exists():
        save_dir.rmdir()
    temp.rename(save_dir)
