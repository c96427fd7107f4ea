"""Qwen3-MoE and Mixtral from Hugging Face directories: training at TP2 x EP2 and LoRA adapters.

On the tiny random Qwen3MoeForCausalLM and MixtralForCausalLM of tests/helpers/hf_fixtures.py (6 heads in
2 query groups of head_dim 12, 6 experts, top-2 / top-3), fp32, torchrun on gloo:

* for each family, the offline-converted checkpoint trained by one process, and the same HF directory
  loaded by ``--hf-load-dir`` at TP2 x EP2 (sequence parallel, expert TP 1, grouped experts), give the
  same loss curve; the parallel run's ``--hf-save-dir`` is a directory transformers loads, with the
  trained weights (Mixtral's experts saved per expert as ``w1``/``w2``/``w3``, Qwen3-MoE's by name);
* a LoRA adapter peft wrote on Mixtral's attention gives Megatron peft's logits (tools/check_hf_parity.py
  --lora-dir). Routed experts have no PEFT layout (their adapters export merged).

Logits at TP1, TP2, PP2 and EP2: tests/e2e/test_hf_parity.py. Round trips, derived flags and refusals:
tests/unit/test_moe_families.py.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from helpers import hf_fixtures
from helpers.megatron_runs import ROOT, run_pretrain, side_by_side, tail, worst_relative_gap
from helpers.processes import child_env, run_tool

# As tests/e2e/test_parallel_loss_curves.py's DeepSeek-V3: TP and EP reorder fp32 sums (TP-split matmuls,
# experts' outputs combined in another order, grouped matmuls), ~1e-6 relative per step; six Adam steps
# keep that far below 2e-4, while each step of training moves the loss by more than 4e-4 (checked below).
RTOL = 2e-4
LOGIT_BOUND = 1e-4
ITERS = 6
TRAIN = ["--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(ITERS),
         "--lr", "3e-3", "--min-lr", "3e-3", "--lr-decay-style", "constant", "--attention-dropout", "0",
         "--hidden-dropout", "0", "--seed", "1234", "--log-interval", "1", "--eval-iters", "0",
         "--eval-interval", "100000", "--mock-data", "--tokenizer-type", "NullTokenizer",
         "--moe-token-dispatcher-type", "alltoall", "--ckpt-format", "torch"]


def model_flags(hf_dir, model_type):
    import adaptor  # noqa: F401  (before patches: it registers them)
    from adaptor.convert.config_check import model_flags as flags

    return flags(model_type, json.loads((hf_dir / "config.json").read_text()))


# family: (HF_MODELS entry, --model-type-hf, a routed expert's down projection as the saved directory names it)
FAMILIES = {"qwen3_moe": ("qwen3_moe", "qwen3-moe", "model.layers.3.mlp.experts.5.down_proj.weight"),
            "mixtral": ("mixtral", "mixtral", "model.layers.3.block_sparse_moe.experts.5.w2.weight")}


@pytest.mark.parametrize("family", FAMILIES)
def test_curve_at_tp2_ep2_from_hf_dir_equals_one_process(hf_dirs, tmp_path, family):
    from transformers import AutoModelForCausalLM

    from adaptor.convert import HfCheckpoint, Layout, convert_hf_to_megatron

    entry, model_type, expert_down = FAMILIES[family]
    source, out = hf_dirs[entry], tmp_path / "hf_out"
    flags = model_flags(source, model_type) + TRAIN
    converted = convert_hf_to_megatron(source, tmp_path / "mg", model_type, Layout())
    parallel_flags = ["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                      "--expert-tensor-parallel-size", "1", "--sequence-parallel", "--moe-grouped-gemm"]
    single, parallel = side_by_side(
        lambda: run_pretrain(flags + ["--load", str(converted), "--finetune", "--no-load-optim", "--no-load-rng"]),
        lambda: run_pretrain(flags + parallel_flags + ["--hf-load-dir", str(source), "--hf-save-dir", str(out)],
                             nproc=2))
    for run in (single, parallel):
        assert run.returncode == 0, tail(run.output)
        assert len(run.losses) == ITERS, tail(run.output)
    curve, reference = parallel.curve(), single.curve()
    assert worst_relative_gap(curve, reference) <= RTOL, (curve, reference)
    # every step moves the loss by more than twice the tolerance: a run one step off anywhere would fail
    assert min(abs(a - b) / abs(b) for a, b in zip(reference[1:], reference)) > 2 * RTOL, reference
    assert reference[-1] < reference[0], reference

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)  # transformers loads what was saved
    saved, original = HfCheckpoint(out), HfCheckpoint(source)
    assert sorted(saved.names()) == sorted(original.names())
    assert not torch.equal(saved.get(expert_down), original.get(expert_down))  # trained
    assert torch.equal(model.model.layers[3].mlp.experts.down_proj[5], saved.get(expert_down))


def test_mixtral_peft_adapter_logits_match(hf_dirs, tmp_path):
    base = hf_dirs["mixtral"]
    adapter = hf_fixtures.make_peft_attention_adapter(base, tmp_path / "adapter", r=4, alpha=8)
    proc = run_tool("check_hf_parity.py", "--hf-dir", base, "--lora-dir", adapter, cwd=ROOT, timeout=600,
                    env=child_env())
    found = re.search(r"max abs logit difference ([0-9.eE+-]+)", proc.stdout)
    moves = re.search(r"moves logits by up to ([0-9.eE+-]+)", proc.stdout)
    assert found and moves, tail(proc.stdout + proc.stderr)
    line = proc.stdout.strip()
    print(line)
    assert proc.returncode == 0 and line.endswith("ok") and float(found.group(1)) <= LOGIT_BOUND, line
    assert float(moves.group(1)) > 100 * LOGIT_BOUND, line  # the adapter matters
