"""``--disable-jit-fuser`` runs Megatron's fused functions uncompiled, and they compute the same.

A fresh rank imports the adaptor with and without the flag on its command line and calls Megatron's
``bias_swiglu`` (``@jit_fuser``, compiled at import): with the flag dynamo converts no frame and
builds no graph; without it, the same call is compiled (so the check can fail). Both match SwiGLU
written out, the compiled one to float32 rounding.
"""
from __future__ import annotations

import pytest

from helpers.processes import run_child, tagged_json
from helpers.warm_launcher import base_env

CHILD = """
import json
import torch
import adaptor  # reads --disable-jit-fuser from sys.argv
from megatron.core.fusions.fused_bias_swiglu import bias_swiglu
from torch._dynamo.utils import counters

torch.manual_seed(0)
y, b = torch.randn(3, 8), torch.randn(8)
z = y + b
expected = torch.nn.functional.silu(z[:, :4]) * z[:, 4:]
err = (bias_swiglu(y, b) - expected).abs().max().item()
print("FACTS" + json.dumps({"frames": sum(counters["frames"].values()),
                            "graphs": counters["stats"]["unique_graphs"], "err": err}))
"""


@pytest.mark.parametrize("flags", [["--disable-jit-fuser"], []], ids=["disabled", "compiled"])
def test_flag_turns_off_compilation_of_megatrons_fusions(flags):
    out = run_child(CHILD, *flags, env=base_env({"ADAPTOR_QUIET": "1"}), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = tagged_json(out.stdout)
    if flags:
        assert facts["frames"] == 0 and facts["graphs"] == 0, facts
        assert facts["err"] == 0.0, facts
    else:
        assert facts["graphs"] >= 1, facts
        assert facts["err"] < 1e-6, facts
