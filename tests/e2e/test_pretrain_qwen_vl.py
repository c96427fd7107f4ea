"""pretrain_mm.py on Qwen2.5-VL and Qwen3-VL end to end: the examples train, TP=2, PP=2 and FSDP2 reproduce the
Qwen2.5-VL curve, and the Qwen3-VL example's FSDP2 run reproduces its one-process curve.

* ``bash examples/qwen25vl/pretrain.sh`` with no arguments (a tiny random Qwen2.5-VL described by
  model.json's shape keys, the sample conversations drawn on its first run, 30 iterations) starts at
  the loss of a uniform guess over the 1440-token vocabulary, ln 1440 = 7.27, and ends (mean of the
  last 5) more than 3.5 nats lower (measured 7.23 to 2.75).
* ``bash examples/qwen3vl/pretrain.sh`` with no arguments (a tiny random Qwen3-VL, FSDP2 over two
  data-parallel ranks, as MindSpeed-MM trains it; its model.json carries MindSpeed-MM's ``patch``
  section) does the same (measured 7.27 to 2.22), and its curve is the one of ``NPROC=1 FSDP2=0`` (one
  process, no sharding) within RTOL over the 30 iterations (measured 4.2e-7). That one-process run goes
  beside the Qwen2.5-VL example's, on the core it leaves idle.
* TP=2, PP=2 and FSDP2 over two data-parallel ranks reproduce the single-process curve over
  ITERS iterations. Every run starts from one tiny random Hugging Face Qwen2.5-VL directory
  (model.json's ``init_from_hf_path``), each rank reading its own slices, so the layouts share their
  first weights without a checkpoint of ours. The tolerance is tests/e2e/test_pretrain_mm.py's rtol
  2e-5: the runs add the same numbers in a different order (TP-split matmuls of the tower, merger and
  decoder, all-reduced; the pipeline's stages exchange activations exactly; FSDP2 reduce-scatters the
  gradients of the two ranks' micro-batches), which agrees to fp32 rounding (measured: all three equal
  the reference in the 7 digits Megatron logs). A single-process run at a 10% higher learning rate
  differs by about 6e-3 and must fail it; it runs beside the reference, on the core that one leaves idle.
* The same model.json without ``init_from_hf_path``, given the directory as ``--hf-load-dir``, trains exactly
  the reference's curve (every logged loss equal): the flag is read where model.json's key would be.
* FSDP2's default plan makes each vision block and each decoder layer a unit (the run prints its plan).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.megatron_runs import (
    ROOT, UNCOMPILED, free_port, launch, losses_of, side_by_side, tail, worst_relative_gap,
)
from helpers.paths import TESTS
from helpers.prefetch import prefetched
from helpers.processes import warm_torchrun_env

EXAMPLE = ROOT / "examples" / "qwen25vl"
ITERS = 5
RTOL = 2e-5
LR = 2e-3
# The sample tokenizer's <|image_pad|>, <|video_pad|>, <|vision_start|> (tools/make_sample_vl_data.py).
VISION_TOKEN_IDS = (1438, 1439, 1436)
VOCAB = 1440

MAKE_START = """
import sys
from helpers.hf_fixtures import make_tiny_qwen2_5_vl
sys.path.insert(0, {tools!r})
import make_sample_vl_data
make_tiny_qwen2_5_vl({hf!r}, seed=3, vocab_size={vocab}, vision_token_ids={ids!r})
make_sample_vl_data.main(["--output-dir", {data!r}, "--count", "32"])
"""


@prefetched
def start(tmp_path_factory):
    """model.json naming a tiny random Hugging Face Qwen2.5-VL (transformers, in a child process: this one's
    torch state is the tests'), data.json over freshly drawn sample conversations, and the training flags."""
    root = tmp_path_factory.mktemp("qwen_vl")
    code = MAKE_START.format(tools=str(ROOT / "tools"), hf=str(root / "hf"), vocab=VOCAB, ids=VISION_TOKEN_IDS,
                             data=str(root / "data"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]), OMP_NUM_THREADS="1")
    made = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, tail(made.stdout + made.stderr)
    model = {"model_id": "qwen2_5vl", "init_from_hf_path": "hf",
             "image_encoder": {"vision_encoder": {"model_id": "qwen2vit"},
                               "vision_projector": {"model_id": "lnmlp"}},
             "text_decoder": {"model_id": "qwen2_5_lm"}}
    (root / "model.json").write_text(json.dumps(model))
    del model["init_from_hf_path"]
    (root / "model_no_hf.json").write_text(json.dumps(model))
    shutil.copy(EXAMPLE / "data.json", root / "data.json")
    return ["--mm-model", str(root / "model.json"), "--mm-data", str(root / "data.json"),
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(root / "data" / "tokenizer"),
            "--seq-length", "128", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", str(ITERS), "--lr", str(LR), "--min-lr", str(LR / 10), "--lr-decay-style", "cosine",
            "--clip-grad", "1.0", "--seed", "1234", "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", "100000", *UNCOMPILED]


def train(args, nproc=1, extra=()):
    run = launch("pretrain_mm.py", [*args, *extra], nproc)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, ITERS + 1)), tail(run.output)
    return run


def from_hf_load_dir(args):
    """``args`` with model.json's Hugging Face directory given as ``--hf-load-dir`` instead."""
    at = args.index("--mm-model") + 1
    root = Path(args[at]).parent
    return [*args[:at], str(root / "model_no_hf.json"), *args[at + 1:], "--hf-load-dir", str(root / "hf")]


@prefetched
def single_process(start):
    """The reference curve, the same run at a 10% higher learning rate, and the reference from --hf-load-dir."""
    reference, perturbed, flag = side_by_side(lambda: train(start), lambda: train(start, extra=["--lr", str(LR * 1.1)]),
                                              lambda: train(from_hf_load_dir(start)))
    curve = reference.curve()
    assert all(math.isfinite(x) for x in curve) and curve[-1] < curve[0], curve
    return curve, perturbed.curve(), flag.curve()


def run_example(script: str, **variables) -> tuple[list[float], str]:
    """An example as a user runs it (its ranks started from the session's zygote when runs start warm): its
    30 losses, checked to start at a uniform guess and to fall, and its output."""
    env = warm_torchrun_env(dict(os.environ, ADAPTOR_BACKEND="cpu", OMP_NUM_THREADS="1", LOG_INTERVAL="1",
                                 MASTER_PORT=str(free_port()), **variables,
                                 PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]))
    proc = subprocess.run(["bash", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, tail(out)
    logged = losses_of(out)
    assert sorted(logged) == list(range(1, 31)), tail(out)
    losses = [logged[i] for i in sorted(logged)]
    assert all(math.isfinite(x) for x in losses), losses
    assert abs(losses[0] - math.log(VOCAB)) < 0.3, losses
    assert sum(losses[-5:]) / 5 < losses[0] - 3.5, losses
    return losses, out


@prefetched
def one_process_examples():
    """The Qwen2.5-VL example and, beside it, the Qwen3-VL one in one process without FSDP2."""
    return side_by_side(lambda: run_example("examples/qwen25vl/pretrain.sh"),
                        lambda: run_example("examples/qwen3vl/pretrain.sh", NPROC="1", FSDP2="0"))


def test_example_trains(one_process_examples):
    qwen25, _ = one_process_examples
    assert qwen25


def test_qwen3_vl_example_trains_with_fsdp2_on_the_one_process_curve(one_process_examples):
    losses, out = run_example("examples/qwen3vl/pretrain.sh")
    reference, _ = one_process_examples[1]
    print(f"Qwen3-VL example: {losses[0]:.4f} -> {sum(losses[-5:]) / 5:.4f} (mean of the last 5); worst relative "
          f"gap to one process {worst_relative_gap(losses, reference):.2e}")
    assert worst_relative_gap(losses, reference) <= RTOL, (losses, reference)
    # untied: the embedding and the output layer are units of their own
    assert "units [language_model.embedding, language_model.decoder.layers.0, language_model.decoder.layers.1, " \
           "language_model.output_layer, vision_model.layers.0, vision_model.layers.1] + root" in out, tail(out)
    assert "patch.clip_grad_async: MindSpeed-MM keeps the gradient norm" in out, tail(out)


LAYOUTS = {
    "tp2": ["--tensor-model-parallel-size", "2"],
    "pp2": ["--pipeline-model-parallel-size", "2"],
    "fsdp2_dp2": ["--use-torch-fsdp2"],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_reproduces_single_process_curve(layout, start, single_process, tmp_path):
    # The PP2 run also writes its weights back as a Hugging Face directory (--hf-save-dir), gathered over stages.
    saved = ["--hf-save-dir", str(tmp_path / "hf_out")] if layout == "pp2" else []
    run = train(start, nproc=2, extra=LAYOUTS[layout] + saved)
    reference = single_process[0]
    if saved:
        check_saved_directory(tmp_path / "hf_out", Path(start[start.index("--mm-model") + 1]).parent / "hf")
    assert worst_relative_gap(run.curve(), reference) <= RTOL, (run.curve(), reference)
    if layout == "fsdp2_dp2":
        units = ("units [language_model.decoder.layers.0, language_model.decoder.layers.1, vision_model.layers.0, "
                 "vision_model.layers.1] + root")
        assert units in run.output, tail(run.output)


def test_tolerance_detects_a_wrong_run(single_process):
    reference, perturbed, _ = single_process
    assert worst_relative_gap(perturbed, reference) > RTOL * 10, (perturbed, reference)


def test_hf_load_dir_trains_the_init_from_hf_path_curve(single_process):
    reference, _, flag = single_process
    assert flag == reference, (flag, reference)


def check_saved_directory(out: Path, source: Path) -> None:
    """The directory --hf-save-dir wrote: the source's tensor names and shapes, trained decoder weights (the
    frozen-free run changes them), and transformers loads it as Qwen2_5_VLForConditionalGeneration."""
    from safetensors.torch import load_file
    from transformers import Qwen2_5_VLForConditionalGeneration

    def tensors(folder):
        out = {}
        for file in sorted(folder.glob("*.safetensors")):
            out.update(load_file(file))
        return out

    got, before = tensors(out), tensors(source)
    assert sorted(got) == sorted(before)
    assert all(got[n].shape == before[n].shape for n in got)
    changed = [n for n in got if not torch.equal(got[n], before[n])]
    assert any("layers.0" in n and "language_model" in n or n.startswith("model.layers.0") for n in changed), changed
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(out)
    assert model.config.vision_config.depth == json.loads((source / "config.json").read_text())["vision_config"]["depth"]
