"""Supervised fine-tuning through Megatron's loop: posttrain_gpt.py on the instruction set the repository carries.

The data are real: ``examples/data/sample_instructions.jsonl`` rendered with the example tokenizer's
Qwen3 chat template and packed by ``tools/preprocess_data.py`` (several conversations per sample).

* What the loss sees (tests/scripts/sft_batch_properties.py, the real model on a real packed
  sample): labels outside the loss mask (prompts, padding, conversation ends) are replaced by
  random ids and the gradients stay bit-identical; each conversation's per-token losses inside the
  pack equal the same conversation run alone (4.8e-7 measured: the same fp32 operations over a
  differently shaped batch), for megatron-core's attention with a dense mask and for the adaptor's
  THD attention; without the boundaries they differ by ~0.2 (the control).
* Loss curves: TP2 (with sequence parallelism) and PP2 reproduce the single-process SFT curve, and
  PP2 the single-process LoRA curve, from one start checkpoint; rtol 2e-5 as in
  tests/e2e/test_parallel_loss_curves.py (fp32 reordering is ~1e-6; one wrong gradient is ~1e-2).
* Megatron's own ``--sft`` (SFTDataset, SFTTokenizer) trains on JSONL conversations.
* Bad input: one line each.
"""
from __future__ import annotations

import glob
import json
import math
import re
import subprocess
import sys

import pytest
import torch

from helpers.megatron_runs import (TINY_QWEN3_MODEL, run_pretrain, save_start_checkpoint, side_by_side, tail,
                                  worst_relative_gap)
from helpers.npu_contract import standin_env
from helpers.one_line_errors import assert_one_line_error, run_python
from helpers.paths import EXAMPLES, ROOT, SAMPLE_TOKENIZER, TOOLS
from helpers.prefetch import prefetched

ITERS = 10
RTOL = 2e-5
SEQ = 128  # the sample conversations run 30-110 tokens with the Qwen3 template
INSTRUCTIONS = EXAMPLES / "data" / "sample_instructions.jsonl"
TOKENIZER = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(SAMPLE_TOKENIZER)]
LORA = ["--lora-r", "8", "--lora-alpha", "16",
        "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


def preprocess(prefix, *extra) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(TOOLS / "preprocess_data.py"), "--input", str(INSTRUCTIONS),
           "--output-prefix", str(prefix), "--handler-name", "AlpacaStyleInstructionHandler",
           "--prompt-type", "qwen3", "--tokenizer-type", "PretrainedFromHF",
           "--tokenizer-name-or-path", str(SAMPLE_TOKENIZER), *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


@prefetched
def packed_dataset(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("sft_data") / "instructions"
    proc = preprocess(prefix, "--pack", "--seq-length", str(SEQ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return prefix


def sft_args(prefix, *extra):
    return [*TINY_QWEN3_MODEL, *TOKENIZER, "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
            "--data-path", str(prefix), "--split", "100,0,0",
            "--is-instruction-dataset", "--prompt-type", "qwen3", *extra]


def batch_properties(prefix, *extra) -> dict:
    args = sft_args(prefix, *extra, "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1")
    run = run_pretrain(args, script="tests/scripts/sft_batch_properties.py")
    lines = [line for line in run.output.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, tail(run.output)
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("attention", ["dense_mask", "thd"])
def test_prompt_labels_never_reach_the_gradients_and_conversations_stay_apart(packed_dataset, attention):
    result = batch_properties(packed_dataset, *(["--use-flash-attn"] if attention == "thd" else []))
    assert result["conversations"] >= 2 and result["loss_tokens"] > 0 and result["labels_changed"] > 0, result
    assert result["prompt_label_grad_diff"] == 0.0, result
    assert result["packed_vs_alone"] < 1e-5, result
    assert result["control"] > 1e-2, result


@prefetched
def common_start(tmp_path_factory, packed_dataset):
    ckpt = tmp_path_factory.mktemp("sft_start")
    save_start_checkpoint(sft_args(packed_dataset), ckpt)
    return ckpt


def train(ckpt, prefix, nproc=1, extra=(), warm=True):
    args = sft_args(prefix, "--train-iters", str(ITERS), "--load", str(ckpt), "--finetune",
                    "--no-load-optim", "--no-load-rng", *extra)
    run = run_pretrain(args, nproc=nproc, script="posttrain_gpt.py", warm=warm)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, ITERS + 1)), tail(run.output)
    return run.curve(), run.output


LAYOUTS = {
    "sft_reference": (1, []),
    "sft_tp2_sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "sft_pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "lora_reference": (1, LORA),
    "lora_pp2": (2, ["--pipeline-model-parallel-size", "2", *LORA]),
}


@prefetched
def curves(common_start, packed_dataset):
    names = list(LAYOUTS)
    # SFT at TP=2+SP is launched by torchrun itself, as a user does; the others start warm (docs/testing.md).
    runs = side_by_side(*[(lambda n=n: train(common_start, packed_dataset, *LAYOUTS[n], warm=n != "sft_tp2_sp"))
                          for n in names])
    return dict(zip(names, runs))


def test_sft_learns_the_assistant_turns(curves):
    curve, output = curves["sft_reference"]
    assert curve[-1] < curve[0] - 0.5, curve
    # the run was the SFT stage on the packed instruction set (Megatron's argument dump and dataset builder)
    assert re.search(r"^  stage \.+ sft$", output, re.MULTILINE), tail(output)
    assert "building train, validation, and test datasets (InstructionDataset)" in output, tail(output)
    assert "Traceback" not in output, tail(output)


@pytest.mark.parametrize("layout,reference", [("sft_tp2_sp", "sft_reference"), ("sft_pp2", "sft_reference"),
                                              ("lora_pp2", "lora_reference")])
def test_parallel_fine_tuning_reproduces_the_single_process_curve(curves, layout, reference):
    curve, ref = curves[layout][0], curves[reference][0]
    worst = worst_relative_gap(curve, ref)
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}\n{curve}\n{ref}"


def test_lora_trains_differently_from_full_fine_tuning(curves):
    lora, full = curves["lora_reference"][0], curves["sft_reference"][0]
    assert lora[0] == pytest.approx(full[0], rel=1e-6)  # zero-initialised B: the same model at step 1
    assert lora[-1] < lora[0] and lora[-1] != pytest.approx(full[-1], rel=1e-3), (lora, full)


def test_lora_sft_on_the_npu_standin_matches_cpu(packed_dataset, tmp_path):
    """bf16 LoRA fine-tuning with the fused flags on the NPU backend (torch_npu STAND-IN: every kernel call
    checked against torch_npu 2.14.0's schemas and shape rules; no Ascend kernel runs) against the CPU
    backend from the same weights. Packed conversations reach ``npu_fusion_attention`` as TND with their
    lengths. rtol 1e-3: bf16 rounding in different kernels, as in tests/e2e/test_npu_whole_runs.py."""
    args = sft_args(packed_dataset, *LORA, "--train-iters", "6", "--use-cpu-initialization", "--bf16",
                    "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb")
    log = tmp_path / "npu"
    npu, cpu = side_by_side(
        lambda: run_pretrain(args, env=standin_env(ADAPTOR_BACKEND="npu", STANDIN_NPU_CALL_LOG=str(log)),
                             script="posttrain_gpt.py"),
        lambda: run_pretrain(args, env={"TORCHDYNAMO_DISABLE": "1"}, script="posttrain_gpt.py"))
    for run in (npu, cpu):
        assert run.returncode == 0 and len(run.losses) == 6, tail(run.output)
    torch.testing.assert_close(npu.curve(), cpu.curve(), rtol=1e-3, atol=0)
    calls = [json.load(open(path)) for path in sorted(glob.glob(f"{log}.*.json"))]
    assert max(c.get("npu_fusion_attention", 0) for c in calls) > 0, calls


def test_megatron_sft_trains_on_jsonl_conversations(tmp_path):
    data = tmp_path / "conversations.jsonl"
    with open(INSTRUCTIONS) as f:
        records = [json.loads(line) for line in f][:64]
    with open(data, "w") as f:
        for r in records:
            question = "\n".join(x for x in (r["instruction"], r.get("input", "")) if x)
            messages = [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": question}, {"role": "assistant", "content": r["output"]}]
            f.write(json.dumps({"messages": messages}) + "\n")
    args = [*TINY_QWEN3_MODEL, "--tokenizer-type", "SFTTokenizer", "--tokenizer-model", str(SAMPLE_TOKENIZER),
            "--sft", "--sft-tokenizer-prompt-format", "default", "--data-path", str(data), "--split", "100,0,0",
            "--train-iters", "4"]
    run = run_pretrain(args)
    assert run.returncode == 0, tail(run.output)
    assert len(run.losses) == 4 and all(math.isfinite(x) for x in run.losses.values()), tail(run.output)


@pytest.mark.parametrize("case", ["other_stage", "pretraining_prefix", "prompt_type_mismatch", "sft_bad_line"])
def test_bad_fine_tuning_input_is_one_line(packed_dataset, tmp_path, case):
    if case == "other_stage":
        args, named = sft_args(packed_dataset, "--stage", "dpo"), ["--stage dpo"]
    elif case == "pretraining_prefix":
        for ext in (".bin", ".idx"):
            (tmp_path / f"corpus{ext}").write_bytes(b"")
        args, named = sft_args(tmp_path / "corpus"), ["not an instruction dataset"]
    elif case == "prompt_type_mismatch":
        args = sft_args(packed_dataset)
        args[args.index("--prompt-type") + 1] = "deepseek3"
        named = ["--prompt-type deepseek3", "qwen3"]
    else:
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
        args = [*TINY_QWEN3_MODEL, "--tokenizer-type", "SFTTokenizer", "--tokenizer-model", str(SAMPLE_TOKENIZER),
                "--sft", "--sft-tokenizer-prompt-format", "default", "--data-path", str(bad), "--split", "100,0,0"]
        named = ["line 2", "not valid JSON"]
    proc = run_python([*args, "--train-iters", "2"], tmp_path, script=str(ROOT / "posttrain_gpt.py"))
    assert_one_line_error(proc, named, torchrun=False)
