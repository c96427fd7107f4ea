"""``torch.load`` that cannot run code from the file: ``weights_only=True`` and an explicit allow-list.

A ``.pt`` file is a pickle, and unpickling may call any function the file names (``os.system``
included). torch's ``weights_only`` unpickler builds only tensors, containers and primitive types
plus the globals allowed for the call. :data:`ALLOWED` names the few types Megatron's checkpoints
hold beside those (the argument namespace, the RNG states, its enums and rerun state: what
``megatron.core.safe_globals`` registers, plus the rerun state machine's ``Call`` and ``Caller``,
which a checkpoint saved to rerun an iteration elsewhere holds); nothing else is rebuilt. ``weights_only=True`` is passed
explicitly, so ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot turn it off.

Used by the conversion library (``adaptor.convert``) and by the ``safe_torch_load`` feature,
which routes every ``torch.load`` of a training run through :func:`load`. It reads pickles others
wrote (Megatron's ``--ckpt-format torch``); :mod:`adaptor.checkpoint.object_codec` is the other
half, the format our own checkpoints write, which has no pickle to read at all.
"""
from __future__ import annotations

import importlib
import os
import pickle
import re

# (module, name) of every global a checkpoint may name beyond torch's own weights-only set.
ALLOWED: tuple[tuple[str, str], ...] = (
    ("argparse", "Namespace"),                      # the run's arguments
    ("types", "SimpleNamespace"),
    ("pathlib", "PosixPath"),                       # path-valued arguments
    ("io", "BytesIO"),                              # Transformer Engine's _extra_state
    ("signal", "Signals"),                          # --exit-signal
    ("numpy", "ndarray"),                           # numpy's RNG state
    ("numpy", "dtype"),
    ("numpy.dtypes", "UInt32DType"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("megatron.core.enums", "ModelType"),
    ("megatron.core.transformer.enums", "AttnBackend"),
    ("megatron.core.transformer.enums", "CudaGraphModule"),
    ("megatron.core.transformer.enums", "CudaGraphScope"),
    ("megatron.core.transformer.enums", "InferenceCudaGraphScope"),
    ("megatron.core.optimizer", "OptimizerConfig"),
    ("megatron.core.rerun_state_machine", "Call"),     # the failed validation a rerun checkpoint holds
    ("megatron.core.rerun_state_machine", "Caller"),   # (NamedTuples of a str and ints)
    ("megatron.core.rerun_state_machine", "RerunDiagnostic"),
    ("megatron.core.rerun_state_machine", "RerunMode"),
    ("megatron.core.rerun_state_machine", "RerunState"),
    ("torch._C", "Generator"),                      # torch RNG states
)

_REFUSED = re.compile(r"GLOBAL (\S+?)(?: was not an allowed global| whose module|[ ,]|$)")


class RefusedPickle(Exception):
    """A checkpoint names a global outside the allow-list (or is otherwise not loadable as weights)."""

    def __init__(self, where: str, refused: str):
        self.where, self.refused = where, refused
        super().__init__(f"{where}: refused to unpickle {refused}: a checkpoint may hold only tensors, containers "
                         f"and the types Megatron saves, and loading anything else could run code from the file")


def allowed_globals() -> list:
    """The objects of :data:`ALLOWED` that exist in this environment (an older numpy lacks some)."""
    found = []
    for module, name in ALLOWED:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return found


def describe(f) -> str:
    """The file name of a ``torch.load`` source, for messages."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(f))
    name = getattr(f, "name", None)
    return str(name) if isinstance(name, (str, bytes)) else f"<{type(f).__name__}>"


def refused_global(exc: BaseException) -> str:
    """The global a weights-only load refused, from torch's message (or its last line)."""
    text = str(exc)
    match = _REFUSED.search(text)
    if match:
        return match.group(1).rstrip(".")
    lines = [line.strip() for line in text.splitlines() if line.strip() and "documentation" not in line]
    return lines[-1] if lines else type(exc).__name__


def load(load_fn, *args, **kwargs):
    """``load_fn(f, ...)`` (``torch.load`` or the function it wraps) with ``weights_only=True`` and
    :data:`ALLOWED`; a refused global raises :class:`RefusedPickle` naming the file and the global."""
    import torch

    f = args[0] if args else kwargs.get("f")
    kwargs["weights_only"] = True
    kwargs.pop("pickle_module", None)  # weights_only uses its own unpickler
    if len(args) > 2:  # torch.load(f, map_location, pickle_module)
        args = (*args[:2], None, *args[3:])
    with torch.serialization.safe_globals(allowed_globals()):
        try:
            return load_fn(*args, **kwargs)
        except pickle.UnpicklingError as exc:
            raise RefusedPickle(describe(f), refused_global(exc)) from None


def torch_load(f, **kwargs):
    """:func:`load` of torch's own ``torch.load`` (unwrapped: errors come back as exceptions to the caller,
    also in a training process, where the ``safe_torch_load`` feature wraps ``torch.load``)."""
    import inspect

    import torch

    return load(inspect.unwrap(torch.load), f, **kwargs)
