"""torch_npu's own op contract, loaded from the files its wheel ships, and the checked-op wrapper.

``load()`` defines every schema of ``npu_native_functions_by_codegen.yaml`` in the ``npu``
namespace with ``torch.library`` (as torch_npu does) and executes ``_meta_registrations.py``,
torch_npu's shape and dtype rules, against them. The few torch_npu helpers that file imports
are given fixed answers: an Ascend 910B (SoC 220) with CANN 8.3. Its Meta kernels for aten ops
are removed again at once, so loading the contract changes nothing of torch itself.

``checked(name, reference, rules)`` builds ``torch_npu.<name>``: each call

1. goes through the real schema with meta tensors of the same shapes, strides and dtypes (a
   wrong argument name, type or count fails there, as on a device) and so through torch_npu's
   meta function, whose outputs are what the device would return;
2. passes the documented rules of ``_rules`` that neither file states;
3. is computed by the CPU reference on the real tensors (plain torch, so autograd works);
4. must give exactly the meta outputs' structure, shapes and dtypes, or the stand-in itself is
   wrong and says so.
A reference returns ``None`` for an output it does not model (a reserved output such as
npu_fusion_attention's softmax_out); that output is zeros of the contract's shape and dtype, or
None where the meta function itself returns None.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import torch

from torch_npu._calls import record

SCHEMAS = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
META = "torch_npu/op_plugin/meta/_meta_registrations.py"
SOC_VERSION = 220  # Ascend910B1 in torch_npu's SoC table
CANN_VERSION = "8.3.RC1"


class ContractViolation(RuntimeError):
    """A call that torch_npu's schema, meta rule or documentation rejects."""


class StandinError(RuntimeError):
    """The stand-in's reference disagrees with torch_npu's meta function: a bug here, not in the caller."""


_loaded: dict = {}


def contract_dir() -> Path:
    configured = os.environ.get("TORCH_NPU_CONTRACT_DIR")
    if configured:
        return Path(configured)
    from torch_npu import CONTRACT_VERSION

    return Path(__file__).resolve().parents[1] / "contract" / CONTRACT_VERSION  # tests/npu_standin/contract/<version>


def _helper_modules() -> None:
    """The torch_npu modules _meta_registrations.py imports, with fixed answers."""

    class ErrCode:
        def __getattr__(self, name):
            return name

    def module(name, **attrs):
        mod = sys.modules.get(name) or types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    # torch_npu's own dtype ids, from the id table at the top of that file; the two it does not
    # list get ids of no dtype, so comparisons with them are simply false.
    module("torch_npu", int4=285, hifloat8=290, float8_e5m2=291, float8_e4m3fn=292, float8_e8m0fnu=293,
           float4_e2m1fn_x2=296, float4_e1m2fn_x2=297, float4_e2m1=-1, float4_e1m2=-2, uint8=0)
    module("torch_npu.utils", __path__=[])
    module("torch_npu.utils._error_code", ErrCode=ErrCode(), ops_error=lambda code: f" [ERR{code}]")
    module("torch_npu.npu.utils", get_cann_version=lambda *a, **k: CANN_VERSION)
    module("torch_npu.npu._backends", get_soc_version=lambda: SOC_VERSION)


def load() -> dict:
    """Define the schemas and the meta rules once; returns {'defined': n, 'skipped': n, 'dir': path}."""
    if _loaded:
        return _loaded
    import yaml

    directory = contract_dir()
    missing = [f for f in (SCHEMAS, META) if not (directory / f).is_file()]
    if missing:
        raise ImportError(
            f"torch_npu stand-in: the torch_npu contract is missing under {directory} "
            f"({', '.join(missing)}); `python tests/helpers/npu_contract.py --refresh` extracts it from the wheel")
    spec = yaml.safe_load((directory / SCHEMAS).read_text())
    lib = torch.library.Library("npu", "DEF")
    defined = skipped = 0
    for section in spec.values():
        if not isinstance(section, list):
            continue
        for entry in section:
            if not isinstance(entry, dict) or "func" not in entry:
                continue  # bare aten names: no schema to define
            try:
                lib.define(entry["func"])
                defined += 1
            except RuntimeError:
                skipped += 1  # aten overloads torch already owns
    _helper_modules()
    namespace = {"__name__": "torch_npu._meta_registrations", "__file__": str(directory / META)}
    exec(compile((directory / META).read_text(), str(directory / META), "exec"), namespace)
    namespace["m_aten"]._destroy()  # its aten Meta kernels would change torch for everyone
    _loaded.update(defined=defined, skipped=skipped, dir=str(directory), libs=(lib, namespace["m"]))
    return _loaded


def _meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v) for v in value)
    return value


def _bind(schema, args, kwargs) -> dict:
    positional = [a for a in schema.arguments if not a.kwarg_only]
    bound = {a.name: v for a, v in zip(positional, args)}
    bound.update(kwargs)
    for a in schema.arguments:
        if a.name not in bound:
            bound[a.name] = a.default_value if a.has_default_value() else None
    return bound


def _flat(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _conform(name: str, result, expected):
    """The reference's outputs, with None filled from the contract; raises StandinError on a mismatch."""
    got, want = _flat(result), _flat(expected)
    if isinstance(result, (list, tuple)) != isinstance(expected, (list, tuple)) or len(got) != len(want):
        raise StandinError(f"{name}: reference returned {len(got)} outputs, the contract {len(want)}")
    out = []
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, torch.Tensor):
            if g is None:
                g = torch.zeros(w.shape, dtype=w.dtype)
            elif tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
                raise StandinError(f"{name}: output {i} is {tuple(g.shape)} {g.dtype}, "
                                   f"the contract says {tuple(w.shape)} {w.dtype}")
        out.append(g)
    return type(result)(out) if isinstance(result, (list, tuple)) else out[0]


def checked(name: str, reference, rules=()):
    """``torch_npu.<name>``: schema, meta rule, documented rules, then the CPU reference."""
    load()
    packet = getattr(torch.ops.npu, name)
    schema = packet.default._schema

    def op(*args, **kwargs):
        try:
            expected = packet(*_meta(args), **_meta(kwargs))
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ContractViolation(f"{name}: torch_npu {_version()} rejects this call: {exc}") from None
        bound = _bind(schema, args, kwargs)
        given = {a.name for a, _ in zip((a for a in schema.arguments if not a.kwarg_only), args)}
        record(name, args, {k: v for k, v in bound.items() if k not in given})  # keyword ones with defaults
        for rule in rules:
            problem = rule(bound)
            if problem:
                raise ContractViolation(f"{name}: {problem}")
        return _conform(name, reference(**bound), expected)

    op.__name__ = op.__qualname__ = name
    op.schema = str(schema)
    return op


def _version() -> str:
    from torch_npu import CONTRACT_VERSION

    return CONTRACT_VERSION
