"""Whole runs a user makes: the Qwen3 example scripts (README's quick start among them), and bf16 training."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

from helpers.megatron_runs import LOSS_LINE, ROOT, TINY_QWEN3, free_port, run_pretrain, side_by_side, tail
from helpers.prefetch import prefetched
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
    # bf16 parameters under an fp32-main-parameter optimizer (Megatron's Float16OptimizerWithFloat16Params),
    # as Megatron reports them, and numbers that differ from fp32's: --bf16 reached the model
    assert "using torch.bfloat16 for parameters" in bf16.output, tail(bf16.output)
    config = re.search(r"Setting up optimizer with config OptimizerConfig\((.*)\)$", bf16.output, re.MULTILINE)
    assert config and "bf16=True" in config[1] and "main_params_dtype=torch.float32" in config[1], tail(bf16.output)
    assert b != f, (b, f)
    assert "Traceback" not in bf16.output, tail(bf16.output)


DPO_ITERS = 4
DPO_LOSS = re.compile(r"\| dpo loss: ([0-9.Ee+-]+)")


def _script(name: str, env: dict, **popen) -> subprocess.Popen:
    return subprocess.Popen(["bash", f"examples/qwen3/{name}.sh"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


@prefetched
def example_scripts(tmp_path_factory):
    """The Qwen3 example scripts in the order a user runs them, on the prefetch thread (helpers/prefetch.py):
    `bash examples/qwen3/finetune.sh` without a base, which first runs README's quick start
    (`bash examples/qwen3/pretrain.sh`, no model arguments, its default 60 iterations) and then LoRA on the
    sample instructions; METHOD=full on that base; then `generate.sh` and `evaluate.sh` on it, beside
    `dpo.sh` from the full fine-tuning's model.

    The first script runs as a user runs it, through torchrun; the later ones start their ranks from the
    session's zygote (ADAPTOR_TORCHRUN, which the scripts honour as the tools do), the same processes
    without the imports (tests/e2e/test_warm_launcher.py). Each script's exit status and output are kept
    for the tests below; a later script runs even when an earlier one failed, and then fails too."""
    tmp = tmp_path_factory.mktemp("examples")
    base_env = dict(os.environ, ADAPTOR_BACKEND="cpu", LOG_INTERVAL="1", MASTER_PORT=str(free_port()),
                    BASE_CACHE=str(tmp / "base"), DATA_CACHE=str(tmp / "data"),
                    PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    runs = {"tmp": tmp}

    def finish(name, proc, timeout=900):
        out, err = proc.communicate(timeout=timeout)
        runs[name] = (proc.returncode, out, err)

    finish("lora", _script("finetune", dict(base_env, TRAIN_ITERS="20", SAVE=str(tmp / "lora"),
                                            HF_SAVE=str(tmp / "lora_hf"))))
    finish("full", _script("finetune", warm_torchrun_env(dict(base_env, METHOD="full", TRAIN_ITERS="10",
                                                              SAVE=str(tmp / "full"), MASTER_PORT=str(free_port())))))
    started = {name: _script(name, warm_torchrun_env(dict(base_env, MASTER_PORT=str(free_port()), **extra)))
               for name, extra in (("generate", {"MAX_NEW_TOKENS": "8"}), ("evaluate", {"OUTPUT": str(tmp / "eval.json")}),
                                   ("dpo", {"SFT_CACHE": str(tmp / "full"), "TRAIN_ITERS": str(DPO_ITERS), "GBS": "8",
                                            "SAVE": str(tmp / "dpo")}))}
    for name, proc in started.items():
        finish(name, proc, timeout=600)
    return runs


def test_quick_start_then_lora_tuning(example_scripts):
    """finetune.sh without a base: README's quick start pretrains it, then LoRA writes adapters only and a
    PEFT directory."""
    tmp = example_scripts["tmp"]
    rc, stdout, stderr = example_scripts["lora"]
    out = stdout + stderr
    assert rc == 0, tail(out)
    assert "pretraining the tiny example" in out, tail(out)
    assert (tmp / "base" / "latest_checkpointed_iteration.txt").read_text().strip() == "60"
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
    assert len(list((tmp / "data").glob("sample_corpus-*_text_document.idx"))) == 1
    tuned = losses[60:]
    assert tuned[-1] < tuned[0], tuned
    assert (tmp / "lora_hf" / "adapter_config.json").is_file(), tail(out)
    assert (tmp / "lora_hf" / "adapter_model.safetensors").is_file(), tail(out)
    assert len(list((tmp / "data").glob("sample_instructions-*_packed_input_ids_document.idx"))) == 1


def test_full_tuning_reuses_the_base(example_scripts):
    """METHOD=full tunes every weight of the base the first script left (no second pretraining)."""
    rc, stdout, stderr = example_scripts["full"]
    out = stdout + stderr
    assert rc == 0, tail(out)
    assert "pretraining the tiny example" not in out, tail(out)
    losses = [float(v) for _, v in LOSS_LINE.findall(out)]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses), tail(out)
    assert (example_scripts["tmp"] / "full" / "latest_checkpointed_iteration.txt").read_text().strip() == "10"


def test_generate_and_evaluate_scripts(example_scripts):
    """`bash examples/qwen3/generate.sh` on the pretrained base (BASE_CACHE): its two sample prompts, greedy,
    with the KV cache, through inference.py --load on the safetensors checkpoint; at the same time
    `bash examples/qwen3/evaluate.sh`: lm-eval's sample_mc task (tools/make_mc_task.py) through evaluation.py
    on that base, its results written as JSON."""
    import json

    rc, eval_out, eval_err = example_scripts["evaluate"]
    assert rc == 0, tail(eval_out + eval_err)
    scores = json.loads((example_scripts["tmp"] / "eval.json").read_text())["results"]["sample_mc"]
    questions = 16  # tools/make_mc_task.py's set: the accuracy is a count of them
    assert "sample_mc" in eval_out and abs(scores["acc,none"] * questions - round(scores["acc,none"] * questions)) < 1e-9
    assert 0 <= scores["acc,none"] <= 1, scores

    rc, gen_out, gen_err = example_scripts["generate"]
    out = gen_out + gen_err
    assert rc == 0, tail(out)
    assert "pretraining the tiny example" not in out and "successfully loaded checkpoint" in out, tail(out)
    records = [json.loads(line) for line in gen_out.splitlines() if line.startswith('{"prompt"')]
    assert [r["prompt"] for r in records] == ["Yara was a beekeeper who lived in", "Twenty-four plus forty-seven is"]
    for record in records:
        assert 1 <= len(record["token_ids"]) <= 8 and record["text"].strip(), record


def test_dpo_script_starts_from_the_fine_tuned_model(example_scripts):
    """`bash examples/qwen3/dpo.sh` on the full fine-tuning's checkpoint (no second SFT): the sample pairs
    tokenized once, the reference that same model, so the first DPO loss is ln 2 (fp32); once the warm-up
    gives a learning rate, the policy leaves its reference. (The loss falls over the script's default 30
    iterations, to about 0.55 by iteration 22; noisy per batch, so a few iterations show only the move.)"""
    rc, stdout, stderr = example_scripts["dpo"]
    out = stdout + stderr
    assert rc == 0, tail(out)
    assert "no SFT model yet" not in out and "successfully loaded checkpoint" in out, tail(out)
    losses = [float(v) for v in DPO_LOSS.findall(out)]
    assert len(losses) == DPO_ITERS, tail(out)
    assert abs(losses[0] - math.log(2)) < 1e-5, losses
    assert all(abs(x - math.log(2)) > 1e-4 for x in losses[2:]), losses
    tmp = example_scripts["tmp"]
    assert (tmp / "dpo" / "latest_checkpointed_iteration.txt").read_text().strip() == str(DPO_ITERS)
    assert len(list((tmp / "data").glob("sample_pairs-*_packed_chosen_input_ids_document.idx"))) == 1

