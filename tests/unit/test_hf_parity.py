"""Hugging Face checkpoints with RoPE scaling, in transformers itself, and the parity tool's bad input.

The parity of tests/e2e/test_hf_parity.py (Megatron's logits equal transformers' for Qwen3 with YaRN
``rope_scaling`` and with linear position interpolation) means something only if the scaling changes
transformers' logits: checked here on the same tiny random Qwen3ForCausalLM (and Llama 3) directories
(tests/helpers/hf_fixtures.py). Also: tools/check_hf_parity.py on a directory without config.json
is one line.
"""
from __future__ import annotations

import pytest
import torch

from helpers.megatron_runs import ROOT
from helpers.processes import run_tool

# Measured max abs logit differences are 0.8e-6 to 1.0e-6 with logits up to 1.8 (fp32: the sums
# run in a different order — fused QKV, TP-split matmuls, vocab-parallel output). 1e-4 is the
# bound we hold conversions to; a wrong mapping or semantic (rope layout, yarn mscale, router scaling, a swapped
# tensor) gives differences of 1e-2 or more on these random weights.
LOGIT_BOUND = 1e-4


def test_parity_tool_bad_input(tmp_path):
    proc = run_tool("check_hf_parity.py", "--hf-dir", tmp_path, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"check_hf_parity.py: error: --hf-dir {tmp_path}: no config.json there"]


# Llama 3's scaling leaves the frequencies with wavelengths under 2048 positions alone and turns the others
# by at most 32 x freq x (1 - 1/8) radians in a 32-token batch: measured 7.3e-4, still 7 bounds away.
@pytest.mark.parametrize("name,bounds", [("qwen3_yarn", 100), ("qwen3_yarn_factor", 100), ("qwen3_linear", 100),
                                         ("llama_untied", 5)])
def test_rope_scaling_changes_the_logits(hf_dirs, name, bounds):
    """The parity of tests/e2e/test_hf_parity.py means something: the same weights without rope_scaling give other logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokens = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    scaled = AutoModelForCausalLM.from_pretrained(hf_dirs[name], attn_implementation="eager").eval()
    config = AutoConfig.from_pretrained(hf_dirs[name])
    config.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
    plain = AutoModelForCausalLM.from_pretrained(hf_dirs[name], config=config, attn_implementation="eager").eval()
    with torch.no_grad():
        diff = (scaled(tokens).logits - plain(tokens).logits).abs().max().item()
    assert diff > bounds * LOGIT_BOUND, diff
