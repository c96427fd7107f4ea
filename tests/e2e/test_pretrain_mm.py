"""pretrain_mm.py end to end: a tiny VLM trains, TP=2 reproduces it, pretrained parts load and stay frozen,
and bad input reaches the user as one line.

Runs go through torchrun on gloo (or plain ``python`` with torchrun's rendezvous variables where the
failure comes before Megatron's distributed setup), on the example's model.json/data.json and the
shapes dataset the repository carries.

* The example trains and the images matter: ``bash examples/vlm/pretrain.sh`` with no arguments
  takes the loss from about 7.4 to under half the lowest loss a model blind to the
  image could reach. Every caption is "a {size} {colour} {shape} {place}", drawn independently
  of everything a text-only model sees, so without the image it can do no better than the
  empirical entropy of the captions spread over their loss tokens (the floor is computed from the
  data below, about 0.28 nats per token).
* TP=2, and DP=2 with the distributed optimizer, reproduce the single-process curve over 10
  iterations from one common checkpoint (Megatron's CPU initialization of TP-split weights depends
  on the TP size, so fresh weights would differ). The tolerance is
  tests/e2e/test_parallel_loss_curves.py's rtol 2e-5: the runs add the same numbers in a different order
  (TP-split matmuls of the tower, projector and decoder, all-reduced; gradients all-reduced over DP),
  which agrees to fp32 rounding (measured at most 2e-7 relative here); a run with a 10% higher
  learning rate differs by about 1e-2 and must fail it.
* The common checkpoint comes from a run under --mm-skip-bad-records at learning rate 0 on a copy
  of the example data with one bad record of each kind appended: it counts and skips them.
* Pretrained parts: the text decoder from a Qwen3 checkpoint converted by tools/convert_ckpt.py,
  the vision tower from a Hugging Face CLIP directory, both frozen. After training, the saved
  decoder equals the converted checkpoint and the saved tower the HF tensors exactly, and only the
  projector has gradient buffers. inference.py --mm-model on that checkpoint (KV cache) then
  generates from text what transformers generates on the Qwen3 directory.
* Bad input at each stage (model.json while Megatron parses arguments, model.json against data.json
  while it validates them, a record while the dataset is built) is one ``megatron-adaptor: error:``
  line naming file and JSON path or line, exit 2, no traceback. tests/unit/test_mm_inputs.py checks the
  message of every model.json, data.json and record case in-process; each stage hands its message
  to ``adaptor.errors.fail`` as these do.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.megatron_runs import train_from as _train_from
from helpers.megatron_runs import (
    ROOT, SAMPLE_TOKENIZER, UNCOMPILED, free_port, launch, losses_of, run_pretrain, tail, worst_relative_gap,
)
from helpers.one_line_errors import assert_one_line_error
from helpers.one_line_errors import run_python as run_script
from helpers.prefetch import prefetched
from helpers.processes import warm_torchrun_env

EXAMPLE = ROOT / "examples" / "vlm"
ITERS = 10
RTOL = 2e-5

# The example's model and data with the launch flags of examples/vlm/pretrain.sh, a smaller batch.
MM = ["--mm-model", str(EXAMPLE / "model.json"), "--mm-data", str(EXAMPLE / "data.json")]
TRAIN = [
    "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(SAMPLE_TOKENIZER), "--seq-length", "48",
    "--micro-batch-size", "4", "--global-batch-size", "8", "--lr", "1e-3", "--min-lr", "1e-4",
    "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--seed", "1234",
    "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000", *UNCOMPILED,
]


def run_mm(args, nproc=1, warm=True):
    return run_pretrain(args, nproc=nproc, script="pretrain_mm.py", warm=warm)


def caption_floor() -> float:
    """Lowest mean loss per loss token without the image: the captions' empirical entropy (nats) per
    record over the mean number of loss tokens per record (answer tokens and eod)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(SAMPLE_TOKENIZER / "tokenizer.json"))
    answers, tokens = [], 0
    for line in (EXAMPLE / "data" / "captions.jsonl").read_text().splitlines():
        record = json.loads(line)
        answer = record.get("caption") or record["conversations"][-1]["value"]
        answers.append(answer.lower().rstrip("."))
        tokens += len(tokenizer.encode(answer).ids) + 1
    counts = Counter(answers)
    entropy = -sum(c / len(answers) * math.log(c / len(answers)) for c in counts.values())
    return entropy * len(answers) / tokens


@prefetched
def example_run():
    """The example as a user runs it: one process, so it goes on the core the tests ahead leave idle."""
    env = dict(os.environ, ADAPTOR_BACKEND="cpu", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    return subprocess.run(["bash", "examples/vlm/pretrain.sh"], cwd=ROOT, env=warm_torchrun_env(env),
                          capture_output=True, text=True, timeout=900)


def test_example_trains_and_uses_the_images(example_run):
    proc = example_run
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, tail(out)
    logged = losses_of(out)
    assert sorted(logged) == [1] + list(range(10, 151, 10)), tail(out)  # 150 iterations, logged every 10th
    losses = [logged[i] for i in sorted(logged)]
    assert all(math.isfinite(x) for x in losses), losses
    assert "captions.jsonl: 192 records" in out, tail(out)
    floor = caption_floor()
    assert 0.2 < floor < 0.35, floor
    assert losses[0] > 6.0 and sum(losses[-3:]) / 3 < floor / 2, (losses, floor)


# ----------------------------------------------------------------------------- bad records, skipped
BAD_RECORDS = [
    '{"image": "images/0000.png", "caption": ',                       # not JSON
    json.dumps({"caption": "a small red circle on the left"}),          # no image key
    json.dumps({"image": "images/0001.png", "caption": ""}),            # empty caption
    json.dumps({"image": "images/missing.png", "caption": "a circle"}),  # no such file
    json.dumps({"image": "broken.png", "caption": "a circle"}),          # not an image
]


def example_copy(root: Path, extra_lines=()) -> Path:
    """data.json over a copy of the example's JSONL (same images) with ``extra_lines`` appended."""
    root.mkdir(parents=True, exist_ok=True)
    data = EXAMPLE / "data"
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    shutil.copytree(data / "images", root / "images")
    lines = (data / "captions.jsonl").read_text().splitlines() + list(extra_lines)
    (root / "captions.jsonl").write_text("\n".join(lines) + "\n")
    config = json.loads((EXAMPLE / "data.json").read_text())
    config["dataset_param"]["basic_parameters"] = {"data_path": "captions.jsonl", "data_folder": "."}
    (root / "data.json").write_text(json.dumps(config))
    return root / "data.json"


@prefetched
def common_start(tmp_path_factory):
    """Initial weights, from a run that skips the bad records (one iteration at lr 0 changes nothing)."""
    root = tmp_path_factory.mktemp("skip")
    data_json = example_copy(root / "data", BAD_RECORDS)
    ckpt = root / "ckpt"
    args = ["--mm-model", str(EXAMPLE / "model.json"), "--mm-data", str(data_json), "--mm-skip-bad-records",
            *TRAIN, "--train-iters", "1", "--lr", "0", "--min-lr", "0", "--save", str(ckpt), "--save-interval", "1",
            "--ckpt-format", "safetensors"]
    run = run_mm(args)
    assert run.returncode == 0, tail(run.output)
    counts = ("192 records used, 5 skipped (1 corrupt image, 1 empty caption, 1 invalid line, 1 missing image, "
              "1 missing key) under --mm-skip-bad-records")
    assert counts in run.output, tail(run.output)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    return ckpt


def train_from(ckpt, nproc=1, extra=(), warm=True):
    return _train_from(MM + TRAIN, ckpt, ITERS, nproc, extra, warm=warm, script="pretrain_mm.py").curve()


@prefetched
def reference(common_start):
    curve = train_from(common_start)
    assert all(math.isfinite(x) for x in curve) and curve[-1] < curve[0] - 1.0, curve
    return curve


def worst_rtol(curve, reference):
    return worst_relative_gap(curve, reference)


LAYOUTS = {
    "tp2": ["--tensor-model-parallel-size", "2"],
    "dp2_distributed_optimizer": ["--use-distributed-optimizer"],
    "fsdp2_dp2": ["--use-torch-fsdp2"],
    # The vision tower out of sharding (replicated, its gradients averaged over the ranks), as for a frozen tower.
    "fsdp2_dp2_tower_ignored": ["--use-torch-fsdp2", "--fsdp2-config-path",
                                str(EXAMPLE / "fsdp2_frozen_tower.yaml")],
}


COLD = {"tp2"}  # launched by torchrun itself, as a user does (the others start warm: docs/testing.md)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_reproduces_single_process_curve(layout, common_start, reference):
    curve = train_from(common_start, nproc=2, extra=LAYOUTS[layout], warm=layout not in COLD)
    assert worst_rtol(curve, reference) <= RTOL, (curve, reference)


def test_tolerance_detects_a_wrong_run(common_start, reference):
    curve = train_from(common_start, extra=["--lr", "1.1e-3"])
    assert worst_rtol(curve, reference) > RTOL * 10, (curve, reference)


# ----------------------------------------------------------------------------- pretrained, frozen parts
def test_pretrained_decoder_and_tower_load_and_stay_frozen(tmp_path, tiny_hf):
    from helpers.hf_fixtures import make_tiny_vision_tower

    from adaptor.convert import Layout, convert_hf_to_megatron
    from adaptor.mm.config import load_model_config
    from adaptor.mm.weights import vision_tower_tensors

    qwen3 = tiny_hf["qwen3_vocab1436"]  # make_tiny_qwen3(vocab_size=1436): the sample tokenizer's vocabulary
    # tools/convert_ckpt.py --save-format torch: the legacy files, compared below with the saved ones
    converted = convert_hf_to_megatron(qwen3, tmp_path / "qwen3_mg", "qwen3", Layout(), save_format="torch")
    clip = make_tiny_vision_tower(tmp_path / "clip_hf", "clip", layers=3)
    model = json.loads((EXAMPLE / "model.json").read_text())
    model["image_encoder"]["vision_encoder"].update(num_layers=2, ffn_hidden_size=128, freeze=True,
                                                    ckpt_path=str(clip))  # the first 2 of its 3 layers
    model["text_decoder"].update(num_layers=4, hidden_size=64, ffn_hidden_size=192, num_attention_heads=4,
                                 num_query_groups=2, kv_channels=32, freeze=True, ckpt_path=str(converted))
    (tmp_path / "model.json").write_text(json.dumps(model))
    save = tmp_path / "ckpt"
    run = run_mm(["--mm-model", str(tmp_path / "model.json"), "--mm-data", str(EXAMPLE / "data.json"), *TRAIN,
                  "--train-iters", "3", "--save", str(save), "--save-interval", "3", "--ckpt-format", "torch"])
    assert run.returncode == 0, tail(run.output)
    assert "[megatron-adaptor] text decoder: 34 tensors on rank 0 loaded from" in run.output, tail(run.output)
    assert "[megatron-adaptor] vision tower: 29 tensors on rank 0 loaded from" in run.output, tail(run.output)
    grads = sorted(line.split()[0] for line in run.output.splitlines() if "(param.main_grad.dtype=" in line)
    assert grads == sorted(f"vision_projection.encoder.linear_fc{i}.{p}" for i in (1, 2) for p in ("weight", "bias"))
    saved = torch.load(save / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)["model"]
    source = torch.load(converted / "release" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)["model"]
    decoder = {k: v for k, v in source.items() if torch.is_tensor(v)}
    assert len(decoder) == 34
    for name, tensor in decoder.items():
        assert torch.equal(saved["language_model." + name], tensor), name
    vision = load_model_config(tmp_path / "model.json").vision
    tower = dict(vision_tower_tensors(str(clip), vision, 1, 0))
    assert len(tower) == 29 and "decoder.layers.2.mlp.linear_fc1.weight" not in tower
    for name, tensor in tower.items():
        assert torch.equal(saved["vision_model." + name], tensor), name
    assert min(run.losses) < run.losses[1], run.curve()  # the projector trains

    # inference.py on the text side of this checkpoint: its (frozen) language model is the HF Qwen3, so
    # the greedy ids (KV cache; the torch format loads at the TP it was saved at) are transformers'.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = ["Once upon a time", "a small red circle on the"]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    out = tmp_path / "generated.jsonl"
    gen = launch("inference.py", ["--mm-model", str(tmp_path / "model.json"), "--load", str(save),
                                  "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                  str(SAMPLE_TOKENIZER), "--seq-length", "48",
                                  "--input-file", str(tmp_path / "prompts.jsonl"), "--output-file", str(out),
                                  "--max-new-tokens", "8", "--use-kv-cache", *UNCOMPILED])
    assert gen.returncode == 0, tail(gen.output)
    tokenizer = AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))
    hf = AutoModelForCausalLM.from_pretrained(str(qwen3), dtype=torch.float32).eval()
    expected = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            new = hf.generate(input_ids=ids, do_sample=False, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        expected.append(new[: new.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in new else new)
    assert [json.loads(line)["token_ids"] for line in out.read_text().splitlines()] == expected


# ----------------------------------------------------------------------------- bad input, one line
SCRIPT = str(ROOT / "pretrain_mm.py")


def run_python(args, cwd):
    """pretrain_mm.py as one process, with the variables torchrun --nproc_per_node 1 would set."""
    return run_script(args, cwd, script=SCRIPT)


def test_bad_model_json_is_one_line(tmp_path):
    model = json.loads((EXAMPLE / "model.json").read_text())
    del model["image_encoder"]["vision_encoder"]["num_layers"]
    (tmp_path / "model.json").write_text(json.dumps(model))
    args = ["--mm-model", str(tmp_path / "model.json"), "--mm-data", str(EXAMPLE / "data.json"), *TRAIN,
            "--train-iters", "1"]
    assert_one_line_error(run_python(args, tmp_path), [f"{tmp_path}/model.json: image_encoder.vision_encoder"
                                                       f".num_layers: missing"], torchrun=False)


def test_model_json_against_data_json_is_one_line(tmp_path):
    """A check made while Megatron validates the arguments (the two files' image sizes)."""
    data = json.loads((EXAMPLE / "data.json").read_text())
    data["dataset_param"]["preprocess_parameters"]["image_size"] = 64
    data["dataset_param"]["basic_parameters"] = {"data_path": str(EXAMPLE / "data" / "captions.jsonl"),
                                                 "data_folder": str(EXAMPLE / "data")}
    (tmp_path / "data.json").write_text(json.dumps(data))
    args = ["--mm-model", str(EXAMPLE / "model.json"), "--mm-data", str(tmp_path / "data.json"), *TRAIN,
            "--train-iters", "1"]
    assert_one_line_error(run_python(args, tmp_path), [
        f"{tmp_path}/data.json: dataset_param.preprocess_parameters.image_size is 64 but "
        f"{EXAMPLE}/model.json: image_encoder.vision_encoder.image_size is 32"], torchrun=False)


def test_bad_record_is_one_line(tmp_path):
    """A check made while the dataset is built, after Megatron's distributed setup."""
    data_json = example_copy(tmp_path / "data", [json.dumps({"image": "broken.png", "caption": "a circle"})])
    args = ["--mm-model", str(EXAMPLE / "model.json"), "--mm-data", str(data_json), *TRAIN, "--train-iters", "1"]
    assert_one_line_error(run_python(args, tmp_path), [
        f"{tmp_path}/data/captions.jsonl:193: image broken.png: cannot decode"], torchrun=False)
