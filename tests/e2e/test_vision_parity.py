"""CLIP and SigLIP vision towers after conversion equal transformers' (tools/check_vision_parity.py).

Tiny random ``CLIPVisionModel`` and ``SiglipVisionModel`` (tests/helpers/hf_fixtures.py: 3 layers, hidden 64,
4 heads, 32x32 images in 8x8 patches; every weight random, norms around 1, so a swapped or
mis-split tensor changes the output), saved by transformers. The tool builds megatron-core's
``CLIPViTModel`` as pretrain_mm.py does, fills it with the loader model.json's
``vision_encoder.ckpt_path`` uses, and compares its output with transformers' ``last_hidden_state``
(fp32, eager attention) on one random image batch.

Both run at TP2, which splits every weight the mapping splits (TP1 takes the same path with one
part). Bound: 1e-4 absolute, as tests/e2e/test_hf_parity.py's logit bound. Measured: 7e-7 (CLIP) and
9e-7 (SigLIP) at TP2, where the fc2/attention output projections sum two halves and all-reduce
them, and exactly 0 at TP1 (the same fp32 operations in the same order); outputs are of order 5. A wrong mapping
(q/k swapped, a head split across ranks, a missing pre/post norm, the wrong GELU) moves outputs
by 1e-2 or more. ``--tolerance 0`` at TP2 must fail, so the comparison is live.
"""
from __future__ import annotations

import re

import pytest

from helpers.hf_fixtures import make_tiny_vision_tower
from helpers.megatron_runs import ROOT, tail
from helpers.processes import child_env, run_tool

BOUND = 1e-4
_DIFF = re.compile(r"max abs difference ([0-9.eE+-]+)")


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    root = tmp_path_factory.mktemp("towers")
    return {kind: make_tiny_vision_tower(root / kind, kind, seed=3) for kind in ("clip", "siglip")}


def parity(hf_dir, *extra):
    proc = run_tool("check_vision_parity.py", "--hf-dir", hf_dir, *extra, cwd=ROOT, timeout=600, env=child_env())
    found = _DIFF.search(proc.stdout)
    assert found, tail(proc.stdout + proc.stderr)
    return proc.returncode, float(found.group(1)), proc.stdout.strip()


def test_siglip_tp2_equals_transformers(towers):
    code, diff, line = parity(towers["siglip"], "--tp", "2")
    assert code == 0 and diff <= BOUND, line


def test_clip_tp2_equals_transformers_and_the_check_can_fail(towers):
    code, diff, line = parity(towers["clip"], "--tp", "2", "--tolerance", "0")
    assert 0 < diff <= BOUND, line
    assert code == 1 and line.endswith("FAILED"), line
