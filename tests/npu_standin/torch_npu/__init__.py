"""STAND-IN for torch_npu, NOT Ascend's library: the tests import it where no Ascend device exists.

It takes torch_npu's place on ``sys.path`` in test subprocesses so that the adaptor's NPU code
paths, and whole training runs on the ``npu`` backend, run on a CPU. Every ``torch_npu.npu_*``
operator the project calls is held to torch_npu's own contract, loaded from the files the pinned
torch_npu wheel ships (kept in ``tests/npu_standin/contract``, checked by
``tests/helpers/npu_contract.py``): the real schema, the real meta function (output shapes and
dtypes), and the documented rules neither file states (``_rules``, each with its source). Only
then does a CPU reference (``_reference``) compute the result. No Ascend kernel runs here: what
passes proves the calls are ones torch_npu accepts and what they return is what it returns, not
how fast or how exactly a device computes it.

``torch_npu.calls`` records every call as ``(name, args, kwargs)``, ``torch_npu.counts`` counts them.
"""
from __future__ import annotations

import torch

from torch_npu import _contract, _device, _reference, _rules
from torch_npu._calls import calls, counts

CONTRACT_VERSION = "2.14.0"
__version__ = f"{CONTRACT_VERSION}+standin"

ContractViolation = _contract.ContractViolation
StandinError = _contract.StandinError

npu = _device.install()

#: The operators the project calls, each with the documented rules it must also pass.
OPERATORS = {
    "npu_rms_norm": _rules.RMS_NORM,
    "npu_swiglu": _rules.SWIGLU,
    "npu_rotary_mul": _rules.ROTARY_MUL,
    "npu_fusion_attention": _rules.FUSION_ATTENTION,
    "npu_fusion_attention_grad": _rules.FUSION_ATTENTION_GRAD,
    "npu_grouped_matmul": _rules.GROUPED_MATMUL,
    "npu_moe_token_permute": _rules.MOE_TOKEN_PERMUTE,
    "npu_moe_token_unpermute": _rules.MOE_TOKEN_UNPERMUTE,
}
for _name, _op_rules in OPERATORS.items():
    globals()[_name] = _contract.checked(_name, getattr(_reference, _name), _op_rules)


__all__ = ["npu", "calls", "counts", "ContractViolation", "StandinError", *OPERATORS]
del torch
