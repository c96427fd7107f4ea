"""Whole runs a user makes: the Qwen3 example scripts (README's quick start among them), and bf16 training."""
from __future__ import annotations

import math
import os
import subprocess
import sys

from helpers.megatron_runs import LOSS_LINE, ROOT, TINY_QWEN3, free_port, run_pretrain, side_by_side, tail
from helpers.processes import warm_torchrun_env


def test_bf16_trains_on_cpu_and_tracks_fp32(shared_runs):
    """--bf16 runs Megatron's Float16 optimizer path (bf16 params, fp32 main params) on CPU.

    bf16 keeps 8 mantissa bits (relative rounding 2^-9 = 2e-3 per value); the loss of
    this model agrees with fp32 to a few parts in a thousand over 10 steps, so 2e-2 is
    a loose bound that still catches a run that does not train (the loss moves ~0.2).
    """
    args = TINY_QWEN3 + ["--train-iters", "10"]
    # The fp32 run is the session's shared 10-iteration run (see tests/e2e/conftest.py).
    fp32, bf16 = side_by_side(lambda: shared_runs.run(args), lambda: run_pretrain(args + ["--bf16"]))
    for run in (fp32, bf16):
        assert run.returncode == 0, tail(run.output)
        assert sorted(run.losses) == list(range(1, 11)), tail(run.output)
    b, f = bf16.curve(), fp32.curve()
    assert all(math.isfinite(x) for x in b)
    assert b[-1] < b[0] - 0.05, b
    assert max(abs(x - y) / y for x, y in zip(b, f)) < 2e-2, (b, f)
    assert "Float16OptimizerWithFloat16Params" not in bf16.output or "Error" not in bf16.output


def test_example_scripts_pretrain_then_tune_lora_and_full(tmp_path):
    """`bash examples/qwen3/finetune.sh`: without a base it first runs README's quick start,
    `bash examples/qwen3/pretrain.sh` with no model arguments and its default 60 iterations, then LoRA on the
    sample instructions writes adapters only and a PEFT directory; METHOD=full tunes every weight of that base;
    `bash examples/qwen3/generate.sh` generates from that base.

    The first script runs as a user runs it, through torchrun; the later ones start their ranks from the
    session's zygote (ADAPTOR_TORCHRUN, which the scripts honour as the tools do), the same processes
    without the imports (tests/e2e/test_warm_launcher.py)."""
    base_env = dict(os.environ, ADAPTOR_BACKEND="cpu", LOG_INTERVAL="1", MASTER_PORT=str(free_port()),
                    BASE_CACHE=str(tmp_path / "base"), DATA_CACHE=str(tmp_path / "data"),
                    PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    lora_env = dict(base_env, TRAIN_ITERS="20", SAVE=str(tmp_path / "lora"), HF_SAVE=str(tmp_path / "lora_hf"))
    proc = subprocess.run(["bash", "examples/qwen3/finetune.sh"], cwd=ROOT, env=lora_env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, tail(out)
    assert "pretraining the tiny example" in out, tail(out)
    assert (tmp_path / "base" / "latest_checkpointed_iteration.txt").read_text().strip() == "60"
    losses = [float(v) for _, v in LOSS_LINE.findall(out)]
    assert len(losses) == 60 + 20, tail(out)  # the base's pretraining, then the fine-tuning
    assert all(math.isfinite(x) for x in losses)
    # The quick start trains on the embedded corpus, not random tokens, and the loss goes well down.
    assert "(GPTDataset)" in out and "MockGPTDataset" not in out, tail(out)
    pretrained = losses[:60]
    assert sum(pretrained[-3:]) / 3 < pretrained[0] - 1.0, pretrained
    assert "backend=cpu" in out
    # Without Transformer Engine or apex, Megatron's torch Adam runs torch's fused kernel.
    assert "torch's fused Adam kernel" in out, tail(out)
    # Tokenized once into DATA_CACHE; a second run would reuse this pair.
    assert len(list((tmp_path / "data").glob("sample_corpus-*_text_document.idx"))) == 1
    tuned = losses[60:]
    assert tuned[-1] < tuned[0], tuned
    assert (tmp_path / "lora_hf" / "adapter_config.json").is_file(), tail(out)
    assert (tmp_path / "lora_hf" / "adapter_model.safetensors").is_file(), tail(out)
    assert len(list((tmp_path / "data").glob("sample_instructions-*_packed_input_ids_document.idx"))) == 1

    full_env = warm_torchrun_env(dict(base_env, METHOD="full", TRAIN_ITERS="10", SAVE=str(tmp_path / "full"),
                                      MASTER_PORT=str(free_port())))
    proc = subprocess.run(["bash", "examples/qwen3/finetune.sh"], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, tail(out)
    assert "pretraining the tiny example" not in out, tail(out)
    losses = [float(v) for _, v in LOSS_LINE.findall(out)]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses), tail(out)
    assert (tmp_path / "full" / "latest_checkpointed_iteration.txt").read_text().strip() == "10"

    check_generate_and_evaluate_scripts(base_env, tmp_path)


def check_generate_and_evaluate_scripts(base_env: dict, tmp_path) -> None:
    """`bash examples/qwen3/generate.sh` on the pretrained base (BASE_CACHE): its two sample prompts, greedy,
    with the KV cache, through inference.py --load on the safetensors checkpoint; at the same time
    `bash examples/qwen3/evaluate.sh`: lm-eval's sample_mc task (tools/make_mc_task.py) through evaluation.py
    on that base, its results written as JSON."""
    import json

    results = tmp_path / "eval.json"
    started = [subprocess.Popen(["bash", f"examples/qwen3/{script}.sh"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                env=warm_torchrun_env(dict(base_env, MASTER_PORT=str(free_port()), **extra)))
               for script, extra in (("generate", {"MAX_NEW_TOKENS": "8"}), ("evaluate", {"OUTPUT": str(results)}))]
    (gen_out, gen_err), (eval_out, eval_err) = (p.communicate(timeout=600) for p in started)
    assert started[1].returncode == 0, tail(eval_out + eval_err)
    scores = json.loads(results.read_text())["results"]["sample_mc"]
    questions = 16  # tools/make_mc_task.py's set: the accuracy is a count of them
    assert "sample_mc" in eval_out and abs(scores["acc,none"] * questions - round(scores["acc,none"] * questions)) < 1e-9
    assert 0 <= scores["acc,none"] <= 1, scores

    out = gen_out + gen_err
    assert started[0].returncode == 0, tail(out)
    assert "pretraining the tiny example" not in out and "successfully loaded checkpoint" in out, tail(out)
    records = [json.loads(line) for line in gen_out.splitlines() if line.startswith('{"prompt"')]
    assert [r["prompt"] for r in records] == ["Yara was a beekeeper who lived in", "Twenty-four plus forty-seven is"]
    for record in records:
        assert 1 <= len(record["token_ids"]) <= 8 and record["text"].strip(), record
