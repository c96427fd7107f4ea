"""Python objects to JSON plus named tensors, and back, without pickle.

Megatron's checkpoints carry non-tensor state (arguments, scheduler, param groups, RNG states, the
rerun state machine) that torch_dist pickles, so loading could run code. Here values become JSON
and tensors/arrays named safetensors entries; decoding builds only the types below, so a
checkpoint can never make the loader import or call anything.

Encoded forms (JSON):
* ``null``, booleans, ints, strings, lists: themselves; floats too, except non-finite ones
  (``{"__float__": "nan"|"inf"|"-inf"}``); dicts with string keys: themselves (a key that starts
  with ``__`` and the ``__dict__`` form below keep tagged dicts unambiguous);
* ``{"__tuple__": [...]}``, ``{"__set__": [...]}``, ``{"__dict__": [[key, value], ...]}`` for dicts
  with non-string keys;
* ``{"__tensor__": name}`` / ``{"__ndarray__": name}``: a tensor or NumPy array stored under ``name``;
  ``{"__bytes__": name}`` / ``{"__bytesio__": name}``: bytes stored as a uint8 tensor;
* ``{"__dtype__": "float32"}``, ``{"__namespace__": {...}}`` (argparse), ``{"__simplenamespace__": {...}}``,
  ``{"__enum__": "module.Class", "name": member}`` (decoded when that module is already imported,
  which Megatron's are; nothing is imported on the checkpoint's say), ``{"__path__": "..."}``.

Pickles others wrote (``--ckpt-format torch``) are read by :mod:`adaptor.safe_load` instead.
"""
from __future__ import annotations

import argparse
import enum
import io
import math
import pathlib
import sys
import types
from typing import Any, Callable

import numpy as np
import torch


class EncodeError(TypeError):
    """A value that has no pickle-free encoding; the message names where it sits."""


def _enum_class(path: str):
    """The Enum class ``module.Qualname`` if that module is already imported; never imports anything."""
    module_name, _, qualname = str(path).rpartition(".")
    obj = sys.modules.get(module_name)
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) and issubclass(obj, enum.Enum) else None


_TAGS = ("__float__", "__tuple__", "__set__", "__dict__", "__tensor__", "__ndarray__", "__bytes__",
         "__bytesio__", "__dtype__", "__namespace__", "__simplenamespace__", "__enum__", "__path__")


class Encoder:
    """Encode objects; tensors are collected in ``self.tensors`` under ``prefix`` + a running number."""

    def __init__(self, prefix: str, lenient: bool = False):
        self.prefix = prefix
        self.lenient = lenient  # drop values that cannot be encoded instead of failing
        self.tensors: dict[str, torch.Tensor] = {}
        self.dropped: list[str] = []

    def _store(self, tensor: torch.Tensor) -> str:
        name = f"{self.prefix}{len(self.tensors)}"
        self.tensors[name] = tensor.detach().contiguous()
        return name

    def encode(self, obj: Any, where: str = "") -> Any:
        if isinstance(obj, enum.Enum):  # before str/int: Megatron has str- and int-valued enums
            cls = type(obj)
            return {"__enum__": f"{cls.__module__}.{cls.__qualname__}", "name": obj.name}
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"__float__": repr(obj)}
        if isinstance(obj, torch.Tensor):
            return {"__tensor__": self._store(obj.cpu())}
        if isinstance(obj, np.ndarray):
            return {"__ndarray__": self._store(torch.from_numpy(np.ascontiguousarray(obj)))}
        if isinstance(obj, np.generic):
            return self.encode(obj.item(), where)
        if isinstance(obj, (bytes, bytearray)):
            return {"__bytes__": self._store(torch.frombuffer(bytearray(obj), dtype=torch.uint8))}
        if isinstance(obj, io.BytesIO):
            return {"__bytesio__": self._store(torch.frombuffer(bytearray(obj.getvalue()), dtype=torch.uint8))}
        if isinstance(obj, torch.dtype):
            return {"__dtype__": str(obj).removeprefix("torch.")}
        if isinstance(obj, pathlib.PurePath):
            return {"__path__": str(obj)}
        if isinstance(obj, argparse.Namespace):
            return {"__namespace__": self._encode_str_dict(vars(obj), where)}
        if isinstance(obj, types.SimpleNamespace):
            return {"__simplenamespace__": self._encode_str_dict(vars(obj), where)}
        if isinstance(obj, (list, tuple, set, frozenset)):
            items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
            encoded = [self.encode(v, f"{where}[{i}]") for i, v in enumerate(items)]
            if isinstance(obj, list):
                return encoded
            return {"__set__": encoded} if isinstance(obj, (set, frozenset)) else {"__tuple__": encoded}
        if isinstance(obj, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in obj):
                return self._encode_str_dict(obj, where)
            return {"__dict__": [[self.encode(k, f"{where}.<key>"), self.encode(v, f"{where}.{k}")]
                                 for k, v in obj.items()]}
        raise EncodeError(f"{where or 'value'}: a {type(obj).__module__}.{type(obj).__qualname__} "
                          f"cannot be stored without pickle")

    def _encode_str_dict(self, d: dict, where: str) -> dict:
        out = {}
        for key, value in d.items():
            path = f"{where}.{key}" if where else str(key)
            if not self.lenient:
                out[key] = self.encode(value, path)
                continue
            try:
                out[key] = self.encode(value, path)
            except EncodeError:
                self.dropped.append(path)
        return out


def decode(value: Any, get_tensor: Callable[[str], torch.Tensor]) -> Any:
    """Inverse of :meth:`Encoder.encode`; ``get_tensor(name)`` returns a stored tensor."""
    if isinstance(value, list):
        return [decode(v, get_tensor) for v in value]
    if not isinstance(value, dict):
        return value
    tag = next((k for k in value if k in _TAGS), None)
    if tag is None:
        return {k: decode(v, get_tensor) for k, v in value.items()}
    body = value[tag]
    if tag == "__float__":
        return float(body)
    if tag == "__tuple__":
        return tuple(decode(v, get_tensor) for v in body)
    if tag == "__set__":
        return {decode(v, get_tensor) for v in body}
    if tag == "__dict__":
        return {_hashable(decode(k, get_tensor)): decode(v, get_tensor) for k, v in body}
    if tag == "__tensor__":
        return get_tensor(body).clone()
    if tag == "__ndarray__":
        return get_tensor(body).numpy().copy()
    if tag == "__bytes__":
        return get_tensor(body).numpy().tobytes()
    if tag == "__bytesio__":
        return io.BytesIO(get_tensor(body).numpy().tobytes())
    if tag == "__dtype__":
        return dtype_from_name(str(body))
    if tag == "__enum__":
        cls = _enum_class(body)
        name = value.get("name")
        return cls[name] if cls is not None and name in cls.__members__ else name
    if tag == "__path__":
        return pathlib.Path(body)
    if tag == "__namespace__":
        return argparse.Namespace(**decode(body, get_tensor))
    return types.SimpleNamespace(**decode(body, get_tensor))  # __simplenamespace__


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    return key


def dtype_from_name(name: str) -> torch.dtype:
    """``torch.float32`` from ``"float32"``; anything that is not a torch dtype is refused."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype
