"""Bit-for-bit comparison of two checkpoint directories of one iteration, tensor by tensor.

Both of Megatron's sharded formats this project writes are read without Megatron and without a
process group: ``--ckpt-format safetensors`` (each rank file's tensors, shard table and objects,
the RNG states among them, and the common state) and ``torch_dist`` (the ``.distcp`` items read
through torch.distributed.checkpoint on one process, and ``common.pt``). What legitimately differs
between two runs of the same training (the recorded command line and arguments: paths, --load) is
left out; everything else must be equal in bytes. Tensors are compared as raw bytes, so -0.0 and
+0.0 differ and equal NaNs agree.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import torch

# The run's recorded command line and arguments name its own --save/--load and flags like --async-save.
_VOLATILE_COMMON = ("command_line",)
_VOLATILE_STATE = ("args",)


def checkpoint_format(checkpoint_dir) -> str | None:
    """'safetensors', 'torch_dist' or None (no finished checkpoint of either format here)."""
    d = Path(checkpoint_dir)
    try:
        marker = json.loads((d / "metadata.json").read_text())
    except (OSError, ValueError):
        return None
    backend = marker.get("sharded_backend")
    if backend == "safetensors":
        return "safetensors"
    if backend == "torch_dist" and (d / ".metadata").is_file():  # DCP writes it when every rank is done
        return "torch_dist"
    return None


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                       b.detach().reshape(-1).contiguous().view(torch.uint8))


def _describe(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.is_floating_point():
        return f"max |diff| {(a.double() - b.double()).abs().max().item():.3e}"
    return f"{int((a != b).sum())} of {a.numel()} elements differ"


def _compare_values(a, b, where: str, out: list[str]) -> None:
    """Nested dicts/lists/tensors/arrays/plain values, recursively; each difference named by its path."""
    import numpy as np

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            out.append(f"{where}: {type(a).__name__} vs {type(b).__name__}")
        elif not same_bytes(a, b):
            out.append(f"{where}: {_describe(a, b)}")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.dtype != b.dtype \
                or a.shape != b.shape or a.tobytes() != b.tobytes():
            out.append(f"{where}: arrays differ")
    elif isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only in {'the first' if key in a else 'the second'}")
            else:
                _compare_values(a[key], b[key], f"{where}.{key}", out)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} vs {len(b)} items")
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                _compare_values(x, y, f"{where}[{i}]", out)
    elif isinstance(a, float) and isinstance(b, float):
        if a != b and not (a != a and b != b):
            out.append(f"{where}: {a!r} vs {b!r}")
    elif type(a) is not type(b) or a != b:
        out.append(f"{where}: {a!r} vs {b!r}")


# ------------------------------------------------------------------------------ safetensors
def _safetensors_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".safetensors"))


def _compare_safetensors(a: Path, b: Path, out: list[str]) -> int:
    from safetensors import safe_open

    doc_a, doc_b = (json.loads((d / "common.json").read_text()) for d in (a, b))
    for doc in (doc_a, doc_b):
        for key in _VOLATILE_COMMON:
            doc.pop(key, None)
        for key in _VOLATILE_STATE:
            doc.get("state", {}).pop(key, None)
    _compare_values(doc_a, doc_b, "common.json", out)
    names_a, names_b = _safetensors_files(a), _safetensors_files(b)
    if names_a != names_b:
        out.append(f"files: {names_a} vs {names_b}")
        return 0
    count = 0
    for name in names_a:
        with safe_open(str(a / name), "pt") as fa, safe_open(str(b / name), "pt") as fb:
            # The shard table (key, global shape, slice of every tensor) and the objects (RNG states, ...).
            _compare_values(fa.metadata(), fb.metadata(), f"{name}:__metadata__", out)
            keys_a, keys_b = sorted(fa.keys()), sorted(fb.keys())
            if keys_a != keys_b:
                out.append(f"{name}: tensors {sorted(set(keys_a) ^ set(keys_b))[:5]} in one file only")
                continue
            for key in keys_a:
                ta, tb = fa.get_tensor(key), fb.get_tensor(key)
                count += 1
                if not same_bytes(ta, tb):
                    out.append(f"{name}:{key}: {_describe(ta, tb)}")
    return count


# ------------------------------------------------------------------------------ torch_dist
def _dcp_items(d: Path) -> dict:
    """Every item of a torch_dist checkpoint by key; objects (pickled by Megatron) unpickled."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(d)), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    items = {}
    for key, value in state.items():
        if isinstance(value, io.BytesIO):
            value.seek(0)
            value = torch.load(value, map_location="cpu", weights_only=False)  # our own runs' files
        items[key] = value
    return items


def _drop_volatile(common):
    """Megatron's common state (common.pt, or the ``common_state`` object in the .distcp files) without the arguments."""
    target = common[0] if isinstance(common, list) and common and isinstance(common[0], dict) else common
    if isinstance(target, dict):
        for key in _VOLATILE_STATE:
            target.pop(key, None)
    return common


def _compare_torch_dist(a: Path, b: Path, out: list[str]) -> int:
    for d in (a, b):
        if (d / "common.pt").exists() != (a / "common.pt").exists():
            out.append("common.pt: in one checkpoint only")
            return 0
    if (a / "common.pt").exists():
        common = [_drop_volatile(torch.load(d / "common.pt", map_location="cpu", weights_only=False)) for d in (a, b)]
        _compare_values(*common, "common.pt", out)
    items_a, items_b = _dcp_items(a), _dcp_items(b)
    for items in (items_a, items_b):
        for key in items:
            if key.startswith("common_state"):
                _drop_volatile(items[key])
    _compare_values(items_a, items_b, "distcp", out)
    return sum(isinstance(v, torch.Tensor) for v in items_a.values())


def checkpoint_differences(a, b, limit: int = 20) -> tuple[list[str], int]:
    """(differences, number of tensors compared) between two finished checkpoint directories."""
    a, b = Path(a), Path(b)
    fa, fb = checkpoint_format(a), checkpoint_format(b)
    if fa is None or fa != fb:
        return [f"formats: {a} is {fa}, {b} is {fb}"], 0
    out: list[str] = []
    count = (_compare_safetensors if fa == "safetensors" else _compare_torch_dist)(a, b, out)
    if count == 0:
        out.append("no tensors compared")
    return out[:limit], count


def torch_dcp_differences(a, b, limit: int = 20) -> tuple[list[str], int]:
    """(differences, number of tensors compared) between two ``--ckpt-format torch_dcp`` checkpoints.

    Megatron writes that format (its torch FSDP2 path) with torch.distributed.checkpoint alone: no
    ``metadata.json``, the arguments as a top-level ``args`` item, which is left out like the others'.
    """
    a, b = Path(a), Path(b)
    for d in (a, b):
        if (d / "metadata.json").exists() or not (d / ".metadata").is_file():
            return [f"{d} is not a finished torch_dcp checkpoint"], 0
    items_a, items_b = _dcp_items(a), _dcp_items(b)
    for items in (items_a, items_b):
        for key in _VOLATILE_STATE:
            items.pop(key, None)
    out: list[str] = []
    _compare_values(items_a, items_b, "distcp", out)
    count = _tensor_count(items_a)
    if count == 0:
        out.append("no tensors compared")
    return out[:limit], count


def _tensor_count(value) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(_tensor_count(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_count(v) for v in value)
    return 0
