"""--cross-entropy-loss-fusion across processes: TP=2 on gloo, and pretrain_gpt.py's loss curve.

Reference: at TP=2 an unsplit float64 computation (and megatron-core's
``tensor_parallel.vocab_parallel_cross_entropy`` held to the same bound).
Tolerances: losses to 1e-5 in both precisions; fp32 gradients to 1e-6; a bf16
gradient is rounded once from the exact value, so within one bf16 step (2**-8).

The Megatron runs train TINY_QWEN3 for 10 iterations in fp32 from the same
seed with and without the flag (TP=1, and TP=2 on 2 processes): the loss is
bit-identical in fp32 by construction and the gradients differ by fp32
rounding only, so the curves agree to ~1e-6 relative; RTOL=2e-5 as in
test_parallel_loss_curves.py, far below the ~1e-2 that a wrong gradient gives.
The op against Megatron's in this process: tests/unit/test_fused_cross_entropy.py.
"""
from __future__ import annotations


import pytest

from helpers.megatron_runs import ROOT, TINY_QWEN3, run_pretrain, side_by_side, tail, worst_relative_gap
from helpers.megatron_runs import launch
from helpers.processes import tagged_json

RTOL_CURVE = 2e-5
BF16_STEP = 2.0**-8


TP2_SCRIPT = r"""
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
from adaptor.ops.cross_entropy import CHUNK_ENV, fused_vocab_parallel_cross_entropy
os.environ[CHUNK_ENV] = "5"  # 2*13 = 26 tokens: chunks of 5 leave 1
group = dist.group.WORLD
gen = torch.Generator().manual_seed(0)
S, B, V = 13, 2, 96
full = torch.randn(S, B, V, generator=gen, dtype=torch.float64) * 4
target = torch.randint(0, V, (S, B), generator=gen)
target[0, 0], target[1, 1] = -100, V  # no owner anywhere
grad_out = torch.rand(S, B, generator=gen)
lo, hi = rank * V // world, (rank + 1) * V // world
assert ((target >= lo) & (target < hi)).any() and ((target >= 0) & (target < lo) | (target >= hi) & (target < V)).any()
result = {}
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    rounded = full.to(dtype).double()
    valid = (target >= 0) & (target < V)
    lse = torch.logsumexp(rounded, -1)
    # Megatron's convention: an id no rank owns contributes the row max (its target term is x_t - max, or 0)
    tgt = rounded.gather(-1, target.clamp(0, V - 1).unsqueeze(-1)).squeeze(-1)
    tgt = torch.where(valid, tgt, rounded.amax(-1))
    ref_loss = lse - tgt
    ref_grad = (torch.softmax(rounded, -1) - torch.nn.functional.one_hot(target.clamp(0, V - 1), V) * valid.unsqueeze(-1))
    ref_grad = (ref_grad * grad_out.double().unsqueeze(-1))[..., lo:hi]
    errs = {}
    for impl, fn in (("ours", lambda x: fused_vocab_parallel_cross_entropy(x, target, group)),
                     ("megatron", lambda x: vocab_parallel_cross_entropy(x, target, tp_group=group))):
        x = full[..., lo:hi].to(dtype).clone().requires_grad_()
        loss = fn(x)
        loss.backward(grad_out)
        assert x.grad.dtype == dtype, (impl, x.grad.dtype)
        errs[impl] = {"loss": (loss.double() - ref_loss).abs().max().item(),
                      "grad": ((x.grad.double() - ref_grad).abs() / (ref_grad.abs() + 1e-30)).max().item()
                              if name == "bf16" else (x.grad.double() - ref_grad).abs().max().item()}
    result[name] = errs
if rank == 0:
    print("RESULT" + json.dumps(result))
dist.barrier()  # neither rank tears gloo down while the other may still use its pairs (seen: SIGABRT at exit)
dist.destroy_process_group()
"""


def test_tp2_matches_unsplit_reference(tmp_path):
    script = tmp_path / "ce_tp2.py"
    script.write_text(TP2_SCRIPT)
    proc = launch(script, nproc=2, env={"PYTHONPATH": str(ROOT)}, timeout=300)
    out = proc.output
    assert proc.returncode == 0, tail(out)
    result = tagged_json(out, "RESULT")
    for impl in ("ours", "megatron"):
        assert result["fp32"][impl]["loss"] < 1e-5 and result["fp32"][impl]["grad"] < 1e-6, result
        assert result["bf16"][impl]["loss"] < 1e-5, result
        # bf16 gradient: rounded once from the exact value, within one bf16 step
        assert result["bf16"][impl]["grad"] <= BF16_STEP, result


def curve(run, extra):
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, 11)), tail(run.output)
    fused = "patches.fusions.cross_entropy: megatron.core.fusions.fused_cross_entropy" in run.output
    assert fused == ("--cross-entropy-loss-fusion" in extra), tail(run.output)
    return run.curve()


@pytest.mark.parametrize("tp", [1, 2])
def test_pretrain_loss_curve_with_fusion(tp, shared_runs):
    layout = ["--tensor-model-parallel-size", str(tp)]
    # The reference is the session's shared run of these flags (TP=1 is the default, so without the flag):
    # test_fused_whole_model.py and test_training_runs.py compare with the TP=1 one, test_torch_fsdp2.py with TP=2.
    reference_args = TINY_QWEN3 + ["--train-iters", "10"] + (layout if tp > 1 else [])
    jobs = [lambda: shared_runs.run(reference_args, nproc=tp),
            lambda: run_pretrain(TINY_QWEN3 + ["--train-iters", "10", *layout, "--cross-entropy-loss-fusion"], nproc=tp)]
    runs = side_by_side(*jobs) if tp == 1 else [job() for job in jobs]  # two 2-process runs would share 2 cores
    reference = curve(runs[0], layout)
    fused = curve(runs[1], layout + ["--cross-entropy-loss-fusion"])
    worst = worst_relative_gap(fused, reference)
    assert worst <= RTOL_CURVE, f"max relative difference {worst:.2e}\n{fused}\n{reference}"
    assert reference[-1] < reference[0]
