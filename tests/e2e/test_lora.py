"""LoRA fine-tuning through pretrain_gpt.py: training, adapter-only checkpoints, resume, TP=2, bad inputs.

Every run starts from one base checkpoint (tests/helpers/megatron_runs.save_start_checkpoint) given to
``--load``, trains TINY_QWEN3 with r=8, alpha=16 on linear_qkv, linear_proj, linear_fc1, linear_fc2
at lr 1e-2 (adapters learn fast enough for ten iterations to show it), fp32:

* a run with dropout on the adapters' input saves at iterations 5 and 10 (``--ckpt-format
  safetensors``); its loss falls, its checkpoint files hold the adapters and their optimizer state
  and nothing of the base model, and a run resumed from iteration 5 (``--load base --lora-load
  saved --ckpt-step 5``) repeats iterations 6-10 bit for bit (RNG states included: the dropout masks
  are the same);
* without dropout, a TP=2 run with full recompute follows the one-process curve (rtol 2e-5, as
  test_parallel_loss_curves.py: sums in another order), and saves a ``--ckpt-format torch_dist``
  checkpoint that holds only the adapters, whole; a TP=2 sequence-parallel run resumed from the one-process safetensors
  checkpoint of iteration 5 (adapters resharded, SwiGLU's fc1 included) follows it on 6-10;
* bad inputs end in one line: adapters loaded onto a base of another shape, or with another rank,
  a base ``--load`` that holds adapters, a target module the model does not have.
"""
from __future__ import annotations

import json
import struct

from helpers.megatron_runs import (TINY_QWEN3, run_pretrain, save_start_checkpoint, side_by_side, tail,
                                  worst_relative_gap)
from helpers.one_line_errors import assert_one_line_error, run_python
from helpers.paths import ROOT
from helpers.prefetch import prefetched

ITERS, SAVE_AT, RTOL = 10, 5, 2e-5
LORA = ["--lora-r", "8", "--lora-alpha", "16", "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1",
        "linear_fc2", "--lr", "1e-2", "--min-lr", "1e-3"]
TP2 = ["--tensor-model-parallel-size", "2"]


@prefetched
def base(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("lora_base")
    save_start_checkpoint(TINY_QWEN3, ckpt)
    return ckpt


def train(base_dir, *extra, nproc=1, first=1):
    run = run_pretrain(TINY_QWEN3 + LORA + ["--train-iters", str(ITERS), "--load", str(base_dir), *extra], nproc=nproc)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(first, ITERS + 1)), tail(run.output)
    return run


def saving(directory, fmt="safetensors"):
    return ["--save", str(directory), "--save-interval", str(SAVE_AT), "--ckpt-format", fmt]


def resuming(directory, fmt="safetensors"):
    return ["--lora-load", str(directory), "--ckpt-step", str(SAVE_AT), "--ckpt-format", fmt]


@prefetched
def one_process(base, tmp_path_factory):
    """With adapter dropout (saving), and without (saving, the reference of the TP=2 runs)."""
    dropout, plain = tmp_path_factory.mktemp("lora_dropout"), tmp_path_factory.mktemp("lora_plain")
    with_dropout, without = side_by_side(lambda: train(base, "--lora-dropout", "0.1", *saving(dropout)),
                                         lambda: train(base, *saving(plain)))
    return {"dropout": (with_dropout, dropout), "plain": (without, plain)}


def safetensors_names(path) -> list[str]:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(size)) if k != "__metadata__"]


def test_loss_falls_and_the_checkpoint_holds_adapters_only(one_process):
    run, saved = one_process["dropout"]
    curve = run.curve()
    assert sum(curve[-3:]) / 3 < curve[0] - 0.1, curve
    line = next(l for l in run.output.splitlines() if l.startswith("> LoRA r=8"))
    assert "16 adapted linears; 38,912 of 318,272 parameters train" in line, line
    names = [n for f in sorted((saved / "iter_0000005").glob("rank_*.safetensors")) for n in safetensors_names(f)]
    model = [n for n in names if n.startswith("model.")]
    # 4 layers x 4 linears x (A, B), SwiGLU's fc1 B stored as two halves like the fc1 weight
    assert len(model) == 4 * (4 * 2 + 1) and all(".lora_A." in n or ".lora_B." in n for n in model), model
    others = [n for n in names if not n.startswith(("model.", "optimizer.", "__objects__"))]
    assert not others, others
    assert any(n.startswith("optimizer.") for n in names)


def test_resume_from_the_adapter_checkpoint_is_bit_exact(base, one_process):
    full, saved = one_process["dropout"]
    resumed = train(base, "--lora-dropout", "0.1", *resuming(saved), first=SAVE_AT + 1)
    assert "successfully loaded checkpoint from" in resumed.output
    assert resumed.curve() == full.curve()[SAVE_AT:]


def test_tensor_parallel_runs_follow_the_one_process_curve(base, one_process, tmp_path):
    reference, saved = one_process["plain"]
    dist_ckpt = tmp_path / "torch_dist"
    # From the base: TP=2, full recompute (the frozen embedding's output must ask for a gradient), torch_dist.
    tp2 = train(base, *TP2, "--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1", "--save", str(dist_ckpt), "--save-interval", str(ITERS),
                "--ckpt-format", "torch_dist", nproc=2)
    worst = worst_relative_gap(tp2.curve(), reference.curve())
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}\n{tp2.curve()}\n{reference.curve()}"
    from adaptor.checkpoint.shapes import checkpoint_global_shapes

    shapes = checkpoint_global_shapes(dist_ckpt / "iter_0000010")
    model = {k: v for k, v in shapes.items() if not k.startswith("optimizer.")}
    assert len(model) == 8 and all(".lora_A." in k or ".lora_B." in k for k in model), sorted(shapes)
    assert model["decoder.layers.mlp.linear_fc1.lora_B.weight"] == (4, 384, 8)  # whole, from two TP halves
    # From the one-process adapter checkpoint of iteration 5: TP=2 with sequence parallelism.
    resumed = train(base, *TP2, "--sequence-parallel", *resuming(saved), nproc=2, first=SAVE_AT + 1)
    worst = worst_relative_gap(resumed.curve(), reference.curve()[SAVE_AT:])
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}\n{resumed.curve()}\n{reference.curve()}"


def test_bad_lora_inputs_are_one_line(base, one_process):
    _, saved = one_process["plain"]
    cases = [
        (["--lora-r", "8", "--ffn-hidden-size", "128", "--lora-load", str(saved), "--ckpt-format", "safetensors"],
         ["--lora-load", "decoder.layers.mlp.linear_fc1.lora_B.weight", "[4, 384, 8]", "[4, 256, 8]",
          "base model of another shape"]),
        (["--lora-r", "4", "--load", str(base), "--lora-load", str(saved), "--ckpt-format", "safetensors"],
         ["--lora-load", "lora_A.weight", "pass --lora-r 8"]),
        (["--lora-r", "8", "--load", str(saved)], ["--load", "holds LoRA adapters, not a base model"]),
        (["--lora-target-modules", "linear_q_proj"], ["--lora-target-modules linear_q_proj", "this model has no"]),
    ]
    results = side_by_side(*[(lambda argv=argv: run_python(TINY_QWEN3 + ["--train-iters", "2", *argv], ROOT))
                             for argv, _ in cases])
    for (argv, must_name), proc in zip(cases, results):
        assert_one_line_error(proc, must_name, torchrun=False)
