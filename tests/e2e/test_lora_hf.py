"""LoRA with Hugging Face: Megatron's adapted model equals peft + transformers, and its adapters export to peft.

On the tiny random Qwen3ForCausalLM of tests/helpers/hf_fixtures.py (GQA 4 heads / 2 groups, untied),
LoRA r 4, alpha 8 on linear_qkv, linear_proj, linear_fc1 and linear_fc2, fp32, torchrun on gloo:

* an adapter peft itself wrote (random non-zero A and B; q/k/v and gate/up share their A, as Megatron's
  fused linears do) gives Megatron the logits peft gives transformers (tools/check_hf_parity.py
  --lora-dir), at TP1;
* pretrain_gpt.py --hf-load-dir with LoRA trains at TP2 (B moves off zero) and --hf-save-dir writes a
  peft adapter directory: peft loads it, its tensors are exactly what the run's ranks hold, and
  Megatron with it at TP2 has peft's logits;
* --lora-load of peft's directory at PP2 puts exactly that adapter on the ranks, and --hf-save-lora
  merged writes a plain transformers directory whose logits equal peft's with the adapter unmerged; the
  weights LoRA does not touch are the base's bit for bit.

The mapping itself (fused B split per query group, A shared, row-parallel A split) on synthetic
tensors, and adapters Megatron cannot hold: tests/unit/test_lora_hf.py.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from helpers import hf_fixtures
from helpers.megatron_runs import ROOT, run_pretrain, tail
from helpers.processes import child_env, run_tool

# As tests/e2e/test_hf_parity.py: fp32 logits up to ~2 differ by ~1e-6 between Megatron and transformers
# (fused QKV, TP-split matmuls, another summation order). The adapter adds one more fp32 product per
# linear (peft computes B(A(x)) per projection; a merged weight adds s*B@A to W first), of the same
# order; 1e-4 keeps two orders of margin. A wrong split, a swapped projection or a wrong scaling moves
# logits by the adapter's own effect, which every test checks is far larger (> 100 x the bound).
LOGIT_BOUND = 1e-4
R, ALPHA = 4, 8
TARGETS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
HF_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = ["--lora-r", str(R), "--lora-alpha", str(ALPHA), "--lora-dropout", "0", "--lora-target-modules", *TARGETS]
RUN = ["--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr-decay-style", "constant",
       "--clip-grad", "1.0", "--attention-dropout", "0", "--hidden-dropout", "0", "--seed", "1234",
       "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000", "--mock-data",
       "--tokenizer-type", "NullTokenizer", "--ckpt-format", "torch", "--save-interval", "1000"]
# 3 iterations at a high LR: Adam moves every B from its zero start by ~lr per step.
TRAIN = RUN + ["--train-iters", "3", "--lr", "2e-2", "--min-lr", "2e-2"]
# One step at LR 0: Adam's update is lr * m / (sqrt(v) + eps) = 0, the weights stay exactly as loaded.
KEEP = RUN + ["--train-iters", "1", "--lr", "0", "--min-lr", "0"]

_DIFF = re.compile(r"max abs logit difference ([0-9.eE+-]+)")
_MOVES = re.compile(r"moves logits by up to ([0-9.eE+-]+)")


def parity(hf_dir, *extra):
    proc = run_tool("check_hf_parity.py", "--hf-dir", hf_dir, *extra, cwd=ROOT, timeout=600, env=child_env())
    found, moves = _DIFF.search(proc.stdout), _MOVES.search(proc.stdout)
    assert found and moves, tail(proc.stdout + proc.stderr)
    return proc.returncode, float(found.group(1)), float(moves.group(1)), proc.stdout.strip()


def model_flags(hf_dir):
    import adaptor  # noqa: F401
    from adaptor.convert.config_check import model_flags as flags

    return flags("qwen3", json.loads((hf_dir / "config.json").read_text()))


def make_peft_adapter(base_dir, out, seed=0):
    return hf_fixtures.make_peft_adapter(base_dir, out, r=R, alpha=ALPHA, targets=HF_TARGETS, seed=seed)


@pytest.fixture(scope="module")
def base(hf_dirs):
    return hf_dirs["qwen3_untied"]


@pytest.fixture(scope="module")
def made_by_peft(base, tmp_path_factory):
    return make_peft_adapter(base, tmp_path_factory.mktemp("lora") / "peft_adapter")


def test_peft_adapter_logits_match_at_tp1(base, made_by_peft):
    code, diff, moves, line = parity(base, "--lora-dir", made_by_peft)
    print(line)
    assert code == 0 and line.endswith("ok") and diff <= LOGIT_BOUND, line
    assert moves > 100 * LOGIT_BOUND, line


def rank_file(checkpoint, tp_rank, pp_rank, pp):
    name = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "")
    return checkpoint / "iter_0000003" / name / "model_optim_rng.pt"


def lora_state(path):
    from adaptor.convert.torch_legacy import read_model_state

    return {n: t for n, t in read_model_state(path).items() if ".lora_A." in n or ".lora_B." in n}


def test_trained_adapter_exports_to_peft_at_tp2(base, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from adaptor.convert import Layout
    from adaptor.convert.lora import PeftAdapter, peft_rank_tensors, settings_from_args

    out, ckpt = tmp_path / "adapter", tmp_path / "ckpt"
    run = run_pretrain(model_flags(base) + TRAIN + LORA + [
        "--tensor-model-parallel-size", "2", "--hf-load-dir", str(base), "--hf-save-dir", str(out),
        "--save", str(ckpt)], nproc=2)
    assert run.returncode == 0, tail(run.output)
    assert f"wrote PEFT LoRA adapter {out}" in run.output, tail(run.output)
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((out / "adapter_config.json").read_text())
    assert {k: config[k] for k in ("peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "task_type",
                                   "bias", "base_model_name_or_path")} == {
        "peft_type": "LORA", "r": R, "lora_alpha": ALPHA, "lora_dropout": 0.0, "target_modules": HF_TARGETS,
        "task_type": "CAUSAL_LM", "bias": "none", "base_model_name_or_path": str(base)}

    # peft loads it onto the base model: every adapter weight it holds is the file's.
    adapter = PeftAdapter(out)
    assert len(adapter.names) == 4 * 7 * 2
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), out)
    loaded = {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}
    assert sorted(loaded) == sorted(adapter.names)
    assert all(torch.equal(loaded[n], adapter.get(n)) for n in loaded)
    assert min(adapter.get(n).abs().max().item() for n in adapter.names if "lora_B" in n) > 1e-3  # trained

    # Mapped back to TP2, the file is exactly what each rank held at the end of training.
    args = type("Args", (), {"lora_r": R, "lora_alpha": ALPHA, "lora_dropout": 0.0, "lora_target_modules": TARGETS})
    hf_config = json.loads((base / "config.json").read_text())
    for tp_rank in range(2):
        held = lora_state(rank_file(ckpt, tp_rank, 0, 1))
        assert len(held) == 4 * 4 * 2
        mapped = dict(peft_rank_tensors(adapter, "qwen3", hf_config, Layout(tp=2), tp_rank, 0, 0,
                                        settings_from_args(args), set(held)))
        assert all(torch.equal(mapped[n], held[n]) for n in held), tp_rank

    # And Megatron with that adapter has peft's logits (the TP2 case of the parity above).
    code, diff, moves, line = parity(base, "--lora-dir", out, "--tp", "2")
    print(line)
    assert code == 0 and line.endswith("ok") and diff <= LOGIT_BOUND, line
    assert moves > 100 * LOGIT_BOUND, line


def test_peft_adapter_loads_and_exports_merged_at_pp2(base, made_by_peft, tmp_path):
    """--lora-load of peft's directory at PP2 (lr 0: Adam leaves the weights exactly as loaded), exported merged."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from adaptor.convert import HfCheckpoint, Layout
    from adaptor.convert.lora import PeftAdapter, peft_adapter_from_rank_files, settings_from_args

    merged_dir, ckpt = tmp_path / "merged", tmp_path / "ckpt"
    run = run_pretrain(model_flags(base) + KEEP + LORA + ["--pipeline-model-parallel-size", "2",
        "--hf-load-dir", str(base), "--lora-load", str(made_by_peft), "--hf-save-dir", str(merged_dir),
        "--hf-save-lora", "merged", "--save", str(ckpt)], nproc=2)
    assert run.returncode == 0, tail(run.output)
    assert f"LoRA tensors from PEFT adapter {made_by_peft}" in run.output, tail(run.output)
    assert f"wrote Hugging Face directory (LoRA merged) {merged_dir}" in run.output, tail(run.output)

    # What the PP2 ranks held (their --save), exported again: peft's adapter bit for bit.
    args = type("Args", (), {"lora_r": R, "lora_alpha": ALPHA, "lora_dropout": 0.0, "lora_target_modules": TARGETS})
    original = HfCheckpoint(base)
    again = tmp_path / "adapter"
    again.mkdir()
    peft_adapter_from_rank_files(ckpt / "iter_0000001", again, "qwen3", original.config, Layout(pp=2),
                                 settings_from_args(args))
    source, exported = PeftAdapter(made_by_peft), PeftAdapter(again)
    assert sorted(exported.names) == sorted(source.names)
    assert all(torch.equal(exported.get(n), source.get(n)) for n in source.names)

    # The merged directory: the base's tensor names; only the adapted projections changed.
    merged = HfCheckpoint(merged_dir)
    assert sorted(merged.names()) == sorted(original.names())
    adapted = {n for n in merged.names() if any(f".{h}." in n for h in HF_TARGETS)}
    assert len(adapted) == 4 * 7
    for name in merged.names():
        assert torch.equal(merged.get(name), original.get(name)) == (name not in adapted), name

    # Its logits are those of peft with the adapter, unmerged.
    tokens = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager").eval()
        base_logits = plain(tokens).logits
        with_adapter = PeftModel.from_pretrained(plain, made_by_peft).eval()(tokens).logits
        from_merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32,
                                                           attn_implementation="eager").eval()(tokens).logits
    diff = (from_merged - with_adapter).abs().max().item()
    moves = (with_adapter - base_logits).abs().max().item()
    print(f"merged vs peft adapter: max abs logit difference {diff:.3e}; the adapter moves logits by {moves:.3e}")
    assert diff <= LOGIT_BOUND and moves > 100 * LOGIT_BOUND, (diff, moves)
