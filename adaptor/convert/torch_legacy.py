"""Megatron's per-rank model files (``mp_rank_TT[_PPP][_EEE]/``): legacy ``--ckpt-format torch`` files,
written one tensor at a time, and :class:`RankStates`, which reads those or their safetensors twin.

``torch.save`` needs every tensor in memory at once. The file is a zip (PyTorch's
format): ``data.pkl`` (the object, whose tensors are ``_rebuild_tensor_v2`` calls on
storages named by persistent ids), then one ``data/<key>`` record per storage. This
writer pickles placeholders that reduce exactly as real tensors do (known shapes and
dtypes, from meta tensors), then writes each storage record as its tensor is produced.
``torch.load(path, mmap=True)`` reads the result back without loading it all; reads here go through
:mod:`adaptor.safe_load` (``weights_only=True``, an explicit allow-list), so a file cannot run code.
"""
from __future__ import annotations

import collections
import ctypes
import io
import mmap
import pickle
import sys
from pathlib import Path
from typing import Iterable

import torch

from adaptor.convert.errors import ConversionError
from adaptor.safetensors_file import SafetensorsError, SafetensorsFile, planned

CHECKPOINT_VERSION = 3.0
TRACKER_FILE = "latest_checkpointed_iteration.txt"
CHECKPOINT_FILE = "model_optim_rng.pt"
STATE_FILE = "model.safetensors"  # a rank's model state without pickle (--hf-save-dir's hand-over)


def rank_dir_name(tp_rank: int, pp_rank: int, ep_rank: int, pp: int, ep: int) -> str:
    """As megatron.training.checkpointing.get_checkpoint_name names it."""
    name = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return name + (f"_{ep_rank:03d}" if ep > 1 else "")


class _Storage:
    def __init__(self, key: str, dtype: torch.dtype, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel


class _TensorRecord:
    """Pickles as torch's own tensors do: _rebuild_tensor_v2(storage, 0, size, stride, False, {})."""

    def __init__(self, storage: _Storage, shape: tuple[int, ...]):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce_ex__(self, protocol):
        stride, step = [], 1
        for dim in reversed(self.shape):
            stride.append(step)
            step *= dim
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, tuple(reversed(stride)), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            storage_type = getattr(torch, torch.storage._dtype_to_storage_type_map()[obj.dtype])
            return ("storage", storage_type, obj.key, "cpu", obj.numel)
        return None


def write_model_file(path, specs, tensors: Iterable[tuple[str, torch.Tensor]], extra: dict | None = None) -> None:
    """Write {"model": {name: tensor or None}, **extra} to `path` as torch.save would.

    `specs`: (name, meta tensor) in the order `tensors` yields them, or (name, None) for
    entries stored as None (the ``_extra_state`` of Megatron's linear layers). With virtual pipeline
    stages, a dict {"model0": specs, "model1": specs, ...} (Megatron's keys for its model chunks),
    `tensors` yielding the chunks' tensors one chunk after the other.
    """
    order = []
    state = {}
    for key, chunk_specs in (specs if isinstance(specs, dict) else {"model": specs}).items():
        model = state[key] = collections.OrderedDict()
        for name, meta in chunk_specs:
            if meta is None:
                model[name] = None
                continue
            storage = _Storage(str(len(order)), meta.dtype, meta.numel())
            model[name] = _TensorRecord(storage, tuple(meta.shape))
            order.append((name, meta, storage.key))
    state.update({"checkpoint_version": CHECKPOINT_VERSION, "iteration": 0})
    state.update(extra or {})
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(state)
    data = buffer.getvalue()
    writer = torch._C.PyTorchFileWriter(str(path))
    writer.write_record("data.pkl", data, len(data))
    writer.write_record(".format_version", "1", 1)
    writer.write_record(".storage_alignment", "64", 2)
    writer.write_record("byteorder", sys.byteorder, len(sys.byteorder))
    # planned() first in zip: its last step checks that nothing is left over
    for (_, tensor), (_, _, key) in zip(planned([(name, meta) for name, meta, _ in order], tensors), order):
        tensor = tensor.detach().contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        offset = tensor.storage_offset() * tensor.element_size()
        storage = tensor.untyped_storage()
        if offset or storage.nbytes() != nbytes:
            storage = storage[offset:offset + nbytes]  # the tensor's bytes within a larger storage, not a copy
        writer.write_record(f"data/{key}", storage, nbytes)
        del tensor
    writer.write_end_of_file()


def load_rank_file(path) -> dict:
    """A legacy rank file, memory-mapped and unpickled with ``weights_only`` (:mod:`adaptor.safe_load`)."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path}: missing Megatron checkpoint file")
    from adaptor.safe_load import RefusedPickle, torch_load

    try:
        return torch_load(path, map_location="cpu", mmap=True)
    except RefusedPickle as exc:
        raise ConversionError(str(exc)) from None
    except Exception as exc:  # torch raises RuntimeError/EOFError/UnpicklingError for damaged files
        raise ConversionError(f"{path}: cannot read the checkpoint ({str(exc).splitlines()[0]})") from None


def read_model_state(path, chunk: int | None = None) -> dict:
    """The "model" state dict of one rank file, memory-mapped; ``chunk`` v: "model{v}", the state of
    model chunk v of a checkpoint with virtual pipeline stages."""
    state = load_rank_file(path)
    key = "model" if chunk is None else f"model{chunk}"
    if key not in state:
        chunks = sorted(k for k in state if k.startswith("model") and k[5:].isdigit())
        saved = f"it holds {len(chunks)} model chunks (virtual pipeline stages)" if chunks else "it holds no model"
        raise ConversionError(f"{path}: no '{key}' state dict; {saved}")
    return state[key]


class RankStates:
    """The model state of each rank of one iteration directory at ``layout``, tensor by tensor.

    A rank's directory holds Megatron's legacy ``model_optim_rng.pt`` (memory-mapped, unpickled with
    ``weights_only=True``; tools/convert_ckpt.py reads real checkpoints) or ``model.safetensors`` (what
    ``--hf-save-dir``'s ranks hand over: no pickle). Used pages can be given back (:meth:`release`).
    Keys are (tp, stage, ep) with ``stage`` as :meth:`Layout.stage` numbers it: with virtual pipeline
    stages, model chunk ``stage // pp`` ("model{v}") of pipeline rank ``stage % pp``'s file.

    With expert tensor parallel 1 the expert-parallel ranks may lie inside the tensor-parallel group
    (TP2 x EP2 on two processes: ranks (tp 0, ep 0) and (tp 1, ep 1)), so not every (tp, ep) pair
    has a directory. A tensor of a missing pair is then read where the same part lives: a routed
    expert's from a rank of the same pipeline stage and EP rank (expert TP 1: each holds it whole),
    any other tensor from one of the same TP rank and stage (it is the same on every EP rank).
    """

    def __init__(self, iteration_dir, layout):
        self.path, self.layout = Path(iteration_dir), layout
        self._states: dict = {}
        self._release: dict = {}
        self._present: list | None = None

    def _resolve(self, key, name: str):
        if key in self._states or self.file(key).is_file():
            return key
        if self._present is None:
            self._present = [k for k in self.layout.rank_keys() if self.file(k).is_file()]
        tp_rank, stage, ep_rank = key
        expert = ".experts.local_experts." in name
        if expert and self.layout.expert_tp != 1:
            return key  # each TP rank holds its own part of the expert
        for other in self._present:
            if other[1] == stage % self.layout.pp and (other[2] == ep_rank if expert else other[0] == tp_rank):
                return other[0], stage, other[2]
        return key

    def file(self, key: tuple[int, int, int]) -> Path:
        tp_rank, stage, ep_rank = key
        rank_dir = self.path / rank_dir_name(tp_rank, stage % self.layout.pp, ep_rank, self.layout.pp, self.layout.ep)
        return rank_dir / STATE_FILE if (rank_dir / STATE_FILE).is_file() else rank_dir / CHECKPOINT_FILE

    def state(self, key) -> dict:
        """Every tensor of rank ``key`` = (tp, stage, ep) by its state-dict name (``_extra_state`` entries None)."""
        if key not in self._states:
            path = self.file(key)
            if path.name == STATE_FILE:
                if self.layout.vpp > 1:
                    raise ConversionError(f"{path}: holds one model chunk, not {self.layout.vpp} virtual stages")
                try:
                    file = SafetensorsFile(path)
                except SafetensorsError as exc:
                    raise ConversionError(str(exc)) from None
                self._states[key] = {name: file.get(name) for name in file.tensors}
                self._release[key] = lambda name, file=file: file.release(name)
            else:
                chunk = key[1] // self.layout.pp if self.layout.vpp > 1 else None
                self._states[key] = read_model_state(path, chunk)
                ranges = mapped_ranges(path)
                self._release[key] = lambda name, state=self._states[key]: drop_pages(state[name], ranges)
        return self._states[key]

    def has(self, key, name: str) -> bool:
        return name in self.state(self._resolve(key, name))

    def get(self, key, name: str) -> torch.Tensor:
        key = self._resolve(key, name)
        state = self.state(key)
        if name not in state:
            raise ConversionError(f"{self.file(key)}: tensor {name} missing")
        return state[name]

    def get_meta(self, key, name: str) -> torch.Tensor:
        return self.get(key, name).to("meta")

    def release(self, key, name: str) -> None:
        """Give back the memory-mapped pages of a tensor already used (unchanged pages, re-read on demand)."""
        key = self._resolve(key, name)
        if self._states.get(key, {}).get(name) is not None:
            self._release[key](name)


_LIBC = ctypes.CDLL(None, use_errno=True)


def mapped_ranges(path) -> list[tuple[int, int]]:
    """Address ranges where `path` is memory-mapped into this process (Linux; empty elsewhere)."""
    target = str(Path(path).resolve())
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].strip() == target and fields[1].endswith("p"):
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    ranges.append((start, end))
    except OSError:
        pass
    return ranges


def drop_pages(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> None:
    """madvise(DONTNEED) a tensor's pages if they lie in a private mapping of its (unchanged) file, from which
    they are read again if used: resident memory stays at the tensors in use. Anything else is left alone."""
    storage = tensor.untyped_storage()
    begin, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    start = begin // mmap.PAGESIZE * mmap.PAGESIZE
    if end > begin and any(lo <= start and end <= hi for lo, hi in ranges):
        _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)
