"""Whole training runs on the NPU backend (torch_npu STAND-IN, contract-checked) against the CPU backend.

``ADAPTOR_BACKEND=npu`` with the stand-in of ``tests/npu_standin``: Megatron's loop, every fused
flag, bf16, and each torch_npu operator call checked against torch_npu 2.14.0's schemas, meta
shape rules and documented rules before a CPU reference computes it. No Ascend kernel runs.

The two backends start from the same weights: the CPU backend initialises on the host, so the NPU
runs ask for ``--use-cpu-initialization`` too; and the NPU backend runs Megatron's
``torch.compile``d fusions eagerly, so the CPU reference does too (``TORCHDYNAMO_DISABLE=1``),
since compiled dropout in Megatron's warm-up draws different random numbers than eager dropout.
In fp32 the two curves then agree to the printed digits.

Tolerance in bf16: the NPU path computes in different kernels than the CPU path (each operator
rounds its own output to bf16 once, where the CPU path may round at other points), so the curves
differ by bf16 rounding only. bf16 keeps 8 significant bits (2^-9 ~ 2e-3 relative per value); the
loss averages thousands of such values, and the measured gap is 3e-5 (Qwen3) to 8e-5 (DeepSeek-V3)
relative over 10 iterations. rtol 1e-3 covers that with room, and sits far below what a wrong
route, mask or scale does: a 10 % learning-rate change moves the Qwen3 curve by more (checked).
"""
from __future__ import annotations

import glob
import json

import pytest
import torch

from helpers.megatron_runs import TINY_DEEPSEEK_V3, TINY_QWEN3, run_pretrain, side_by_side, tail
from helpers.npu_contract import standin_env

ITERS = 10
RTOL = 1e-3
SAME_START = ["--use-cpu-initialization", "--bf16", "--train-iters", str(ITERS)]
QWEN3_FUSED = ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-flash-attn",
               "--cross-entropy-loss-fusion"]
DEEPSEEK_FUSED = ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-flash-attn", "--cross-entropy-loss-fusion",
                  "--moe-grouped-gemm", "--moe-permute-fusion", "--expert-model-parallel-size", "2"]
CPU_REFERENCE = {"TORCHDYNAMO_DISABLE": "1"}


def _npu(args, nproc, log):
    env = standin_env(ADAPTOR_BACKEND="npu", STANDIN_NPU_CALL_LOG=str(log))
    return lambda: run_pretrain(args, nproc, env=env)


def _cpu(args, nproc):
    return lambda: run_pretrain(args, nproc, env=CPU_REFERENCE)


def _counts(log) -> list[dict]:
    """Each rank's kernel counts. A launch retried after its port was taken (EADDRINUSE) leaves the files
    of ranks that stopped before seeding; they ran no step and are not counted."""
    counts = [json.load(open(path)) for path in sorted(glob.glob(f"{log}.*.json"))]
    return [c for c in counts if c.get("manual_seed")]


def _kernel_calls(log, name) -> int:
    return max((c.get(name, 0) for c in _counts(log)), default=0)


def _assert_curve(run, reference, what):
    assert run.returncode == 0 and len(run.losses) == ITERS, f"{what}:\n{tail(run.output)}"
    assert reference.returncode == 0 and len(reference.losses) == ITERS, f"{what} (CPU):\n{tail(reference.output)}"
    torch.testing.assert_close(run.curve(), reference.curve(), rtol=RTOL, atol=0, msg=what)


def test_qwen3_every_fused_flag_bf16_matches_cpu(tmp_path):
    args = TINY_QWEN3 + QWEN3_FUSED + SAME_START
    faster = [a if a != "1e-3" else "1.1e-3" for a in args]  # --lr
    npu, cpu, npu_faster = side_by_side(_npu(args, 1, tmp_path / "q"), _cpu(args, 1),
                                        _npu(faster, 1, tmp_path / "f"))
    _assert_curve(npu, cpu, "Qwen3 bf16, every fused flag")
    for kernel in ("npu_rms_norm", "npu_swiglu", "npu_rotary_mul", "npu_fusion_attention"):
        assert _kernel_calls(tmp_path / "q", kernel) > 0, (kernel, _counts(tmp_path / "q"))
    # The tolerance can see a real change: a 10 % larger learning rate leaves it.
    assert npu_faster.returncode == 0, tail(npu_faster.output)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(npu_faster.curve(), cpu.curve(), rtol=RTOL, atol=0)


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_deepseek_v3_ep2_bf16_matches_cpu(tmp_path, dispatcher):
    """MLA, MoE (EP=2, grouped GEMM, permute fusion), MTP: the NPU curve is the CPU curve."""
    args = TINY_DEEPSEEK_V3 + DEEPSEEK_FUSED + SAME_START + ["--moe-token-dispatcher-type", dispatcher]
    log = tmp_path / "ds"
    npu, cpu = side_by_side(_npu(args, 2, log), _cpu(args, 2))
    _assert_curve(npu, cpu, f"DeepSeek-V3 EP=2 {dispatcher}")
    torch.testing.assert_close([npu.mtp_losses[i] for i in sorted(npu.mtp_losses)],
                               [cpu.mtp_losses[i] for i in sorted(cpu.mtp_losses)], rtol=RTOL, atol=0)
    assert len(_counts(log)) == 2
    assert _kernel_calls(log, "npu_grouped_matmul") > 0 and _kernel_calls(log, "npu_fusion_attention") > 0
    if dispatcher == "alltoall":  # every token has top-k experts: the fused kernels route them
        assert _kernel_calls(log, "npu_moe_token_permute") > 0 and _kernel_calls(log, "npu_moe_token_unpermute") > 0
    else:  # tokens have 0..k local experts under EP: the index path, and the log says why
        assert _kernel_calls(log, "npu_moe_token_permute") == 0
        assert "tokens have 0..k of this rank's experts" in npu.output
