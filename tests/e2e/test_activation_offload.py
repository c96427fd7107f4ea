"""Activation offload (--fine-grained-activation-offloading, --swap-attention) leaves the loss curve unchanged.

Every run starts from one checkpoint and trains 10 fp32 iterations on the same mock data, as in
tests/e2e/test_parallel_loss_curves.py. Offloading copies saved tensors to host memory and back:
a copy changes no bit, so on one process the curve equals the run without offload exactly. With
TP2 + sequence parallelism, PP2 with virtual stages (four micro-batches in flight), DP2 with the
distributed optimizer and FSDP2, the reference is still the one-process run without offload, so
the tolerance is that file's rtol=2e-5 (fp32 reordering across ranks, an order of magnitude above
the ~1e-6 it causes and far below the 1e-2 of one wrong gradient).
"""
from __future__ import annotations

import re

import pytest

from helpers.megatron_runs import train_from as _train_from
from helpers.megatron_runs import (TINY_QWEN3, save_start_checkpoint, side_by_side, tail,
                                  worst_relative_gap)
from helpers.npu_contract import standin_env
from helpers.prefetch import prefetched

ITERS = 10
RTOL = 2e-5
# The tiny model's activations are 2x64x64 = 8192 elements; 1024 offloads all but the smallest.
OFFLOAD = ["--fine-grained-activation-offloading", "--min-offloaded-tensor-size", "1024",
           "--offload-modules", "attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"]
SWAP = ["--swap-attention", "--min-offloaded-tensor-size", "1024"]
SUMMARY = re.compile(r"activation offload, first iteration: (.*) offloaded to host memory")


@prefetched
def common_start(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("offload_start")
    save_start_checkpoint(TINY_QWEN3, ckpt)
    return ckpt


def train_from(ckpt, nproc=1, extra=(), env=None):
    return _train_from(TINY_QWEN3, ckpt, ITERS, nproc, extra, env=env)


def offloaded_bytes(run) -> dict[str, float]:
    """Module name -> MiB offloaded in the first iteration, from the run's summary line."""
    found = SUMMARY.search(run.output)
    assert found, tail(run.output)
    return {name: float(mib) for name, mib in re.findall(r"(\w+) ([0-9.]+) MiB", found.group(1))}


@prefetched
def one_process_runs(common_start):
    """Without offload, with --fine-grained-activation-offloading (CPU), with --swap-attention (NPU stand-in)."""
    npu = standin_env(ADAPTOR_BACKEND="npu")
    reference, offload, swap = side_by_side(
        lambda: train_from(common_start),
        lambda: train_from(common_start, extra=OFFLOAD),
        lambda: train_from(common_start, extra=SWAP, env=npu))
    return {"reference": reference, "offload": offload, "swap_npu": swap}


def test_offload_alone_is_bit_exact(one_process_runs):
    run = one_process_runs["offload"]
    assert run.curve() == one_process_runs["reference"].curve()
    moved = offloaded_bytes(run)
    assert set(moved) == {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"}, moved
    assert all(mib > 0 for mib in moved.values()), moved
    assert "saves no device memory here" in run.output  # said once on CPU


def test_swap_attention_on_the_npu_standin(one_process_runs):
    run = one_process_runs["swap_npu"]
    assert "--swap-attention: what self_attention save in forward is offloaded" in run.output
    assert offloaded_bytes(run).get("self_attention", 0) > 0
    assert worst_relative_gap(run.curve(), one_process_runs["reference"].curve()) <= RTOL


LAYOUTS = {
    "tp2_sequence_parallel": ["--tensor-model-parallel-size", "2", "--sequence-parallel", *OFFLOAD],
    "pp2_virtual_stages": ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                           *SWAP, "--swap-modules", "input_norm,self_attention,post_attention_norm"],
    "dp2_distributed_optimizer": ["--use-distributed-optimizer", *OFFLOAD],
    "fsdp2": ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", *SWAP],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_with_offload_reproduces_the_curve(layout, common_start, one_process_runs):
    run = train_from(common_start, nproc=2, extra=LAYOUTS[layout])
    assert sum(offloaded_bytes(run).values()) > 0
    worst = worst_relative_gap(run.curve(), one_process_runs["reference"].curve())
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}"
