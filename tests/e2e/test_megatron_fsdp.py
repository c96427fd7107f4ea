"""Megatron-FSDP (``--use-megatron-fsdp``) on gloo: the single-process loss curve, and its own checkpoint.

Tiny Qwen3 (SwiGLU, fp32) from the same seed: at TP=PP=1 Megatron-FSDP draws the weights one process
draws, and data parallelism only reorders the gradient sums (reduce-scatter, or all-reduce, of the
averaged gradients), so the curves agree to fp32 rounding: rtol 2e-5, the fp32 tolerance of
test_parallel_loss_curves.py (measured 1.6e-7 here). Two sharding levels run: ZeRO-3
(``optim_grads_params``: parameters gathered for each layer and resharded) and ZeRO-1 (``optim``). The
ZeRO-3 run saves ``--ckpt-format fsdp_dtensor`` at iteration 4; at this size whole parameters sit in one
rank's shard, which is what hung upstream's save (patches/upstream_fixes/fsdp_dtensor_checkpoint.py).
Resuming there must continue its curve bit for bit.

Under bf16 with tensor and sequence parallelism and per-token loss, the norms every TP rank holds whole
must stay equal across the ranks (patches/upstream_fixes/megatron_fsdp_grad_scaling.py): a checkpoint
keeps one replica, so a resume continues the curve bit for bit only if the replicas never drifted
(they did: 5e-5 after one resumed step).
"""
from __future__ import annotations

import math

from helpers.megatron_runs import TINY_QWEN3, run_pretrain, side_by_side, tail, worst_relative_gap

ITERS = 8
SAVE_AT = 4
RTOL = 2e-5
MEGATRON_FSDP = ["--use-megatron-fsdp", "--no-gradient-accumulation-fusion", "--ckpt-format", "fsdp_dtensor"]
SET_OFF_CUDA = "gradient_reduce_div_fusion=False (Megatron-FSDP"


def _strategy(name: str) -> list[str]:
    return [*MEGATRON_FSDP, "--data-parallel-sharding-strategy", name]


def test_megatron_fsdp_reproduces_one_process_and_resumes_its_own_checkpoint(tmp_path):
    run = [*TINY_QWEN3, "--train-iters", str(ITERS)]
    zero3 = [*run, *_strategy("optim_grads_params")]
    # CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron-LM's scripts export it: a CUDA knob, unset here.
    one, saved = side_by_side(lambda: run_pretrain(run),
                              lambda: run_pretrain(zero3 + ["--save", str(tmp_path), "--save-interval", str(SAVE_AT)],
                                                   nproc=2, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}))
    zero1, resumed = side_by_side(lambda: run_pretrain(run + _strategy("optim"), nproc=2),
                                  lambda: run_pretrain(zero3 + ["--load", str(tmp_path), "--ckpt-step", str(SAVE_AT)],
                                                       nproc=2))
    assert one.returncode == 0, tail(one.output)
    reference = one.curve()
    assert all(math.isfinite(v) for v in reference) and reference[-1] < reference[0], reference
    for result in (saved, zero1):
        assert result.returncode == 0, tail(result.output)
        assert SET_OFF_CUDA in result.output, tail(result.output)
        assert sorted(result.losses) == list(range(1, ITERS + 1)), tail(result.output)
        assert worst_relative_gap(result.curve(), reference) <= RTOL, (result.curve(), reference)
    assert (tmp_path / f"iter_{SAVE_AT:07d}" / ".metadata").exists(), sorted(tmp_path.rglob("*"))
    assert resumed.returncode == 0, tail(resumed.output)
    assert resumed.curve() == saved.curve()[SAVE_AT:], (resumed.curve(), saved.curve())


def test_tensor_parallel_replicas_stay_equal_under_bf16_per_token_loss(tmp_path):
    run = [*TINY_QWEN3, "--train-iters", str(ITERS), *_strategy("optim_grads_params"), "--bf16",
           "--tensor-model-parallel-size", "2", "--sequence-parallel", "--calculate-per-token-loss"]
    saved = run_pretrain(run + ["--save", str(tmp_path), "--save-interval", str(SAVE_AT)], nproc=2)
    assert saved.returncode == 0, tail(saved.output)
    resumed = run_pretrain(run + ["--load", str(tmp_path), "--ckpt-step", str(SAVE_AT)], nproc=2)
    assert resumed.returncode == 0, tail(resumed.output)
    assert resumed.curve() == saved.curve()[SAVE_AT:], (resumed.curve(), saved.curve())


def test_megatron_fsdp_refuses_what_it_cannot_load_or_save_in_one_line(tmp_path):
    """A torch_dist checkpoint (Megatron-FSDP loads only fsdp_dtensor), an unsharded SwiGLU save and
    hybrid sharding, which trained another curve than one process on gloo."""
    torch_dist = tmp_path / "torch_dist"
    made = run_pretrain([*TINY_QWEN3, "--train-iters", "1", "--save", str(torch_dist), "--save-interval", "1"])
    assert made.returncode == 0, tail(made.output)
    for strategy, extra, words in (
            ("optim_grads_params", ["--load", str(torch_dist)], "loads only its own --ckpt-format fsdp_dtensor"),
            ("no_shard", ["--save", str(tmp_path / "new")], "no_shard cannot save a --swiglu model"),
            ("optim", ["--num-distributed-optimizer-instances", "2"], "trains another loss curve")):
        refused = run_pretrain([*TINY_QWEN3, "--train-iters", "2", *_strategy(strategy), *extra], nproc=2)
        assert refused.returncode != 0
        lines = [line for line in refused.output.splitlines() if line.startswith("megatron-adaptor: error:")]
        assert lines and words in lines[0], tail(refused.output)
        assert "Traceback" not in refused.output, tail(refused.output)
    assert not (tmp_path / "new").exists()
