"""The directories ``tools/safetensors_ckpt.py`` reads and writes, checked without torch.

Which checkpoint a --load-dir names, and the description a merged directory carries (the --save-dir
refusal is :func:`adaptor.checkpoint.files.refuse_nonempty`). Apart from :mod:`adaptor.checkpoint.consolidated`
so that the tool reports a wrong --load-dir or a non-empty --save-dir before importing torch.
"""
from __future__ import annotations

import json
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


def read_side_file(merged_dir) -> dict:
    """The description of a Megatron-named merged directory (what split reads back)."""
    side_path = Path(merged_dir) / SIDE_FILE
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
