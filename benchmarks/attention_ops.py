"""Core attention, fused (--use-flash-attn: FlashAttention) against megatron-core's DotProductAttention.

    python benchmarks/attention_ops.py [--seqs 512 2048 4096] [--repeats 3] [--dtype fp32]

Forward + backward of the core attention alone (q, k, v in [s, b, heads, head_dim], causal,
no explicit mask, micro-batch 1) for two head shapes: the tiny Qwen3 of the tests (4 heads, 2 KV
groups, head dim 32) and Qwen3-0.6B (16 heads, 8 KV groups, head dim 128). Time: the fastest of
``--repeats`` timed iterations after one warm-up (the least disturbed by other load on a shared
machine; the median is printed too). Peak memory: each (module, shape, length) runs
in a process forked from one that has imported megatron but computed nothing; the peak is the
rise of that process's resident-set high-water mark (VmHWM) over its value before the step, so it
counts every allocation the step made (inputs, scores, activations kept for backward, gradients).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ADAPTOR_BACKEND", "cpu")
os.environ.setdefault("ADAPTOR_QUIET", "1")

SHAPES = {"tiny Qwen3 (4 heads, 2 groups, d 32)": (4, 2, 32), "Qwen3-0.6B (16 heads, 8 groups, d 128)": (16, 8, 128)}


def _hwm_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _setup(port):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    ps.initialize_model_parallel(1)
    model_parallel_cuda_manual_seed(1)


def _measure(impl, heads, groups, dim, seq, dtype_name, repeats, port, queue):
    import torch

    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from adaptor.ops.flash_attention import FlashAttention

    _setup(port)
    start = _hwm_kib()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    cfg = TransformerConfig(num_layers=1, hidden_size=heads * dim, num_attention_heads=heads,
                            num_query_groups=groups, kv_channels=dim, attention_dropout=0.0,
                            masked_softmax_fusion=False, bf16=dtype == torch.bfloat16, params_dtype=dtype)
    cls = FlashAttention if impl == "flash" else DotProductAttention
    module = cls(cfg, 1, AttnMaskType.causal, "self")
    q = torch.randn(seq, 1, heads, dim, dtype=dtype, requires_grad=True)
    k = torch.randn(seq, 1, groups, dim, dtype=dtype, requires_grad=True)
    v = torch.randn(seq, 1, groups, dim, dtype=dtype, requires_grad=True)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        out = module(q, k, v, None)
        out.backward(torch.ones_like(out))
        times.append(time.perf_counter() - t0)
        q.grad = k.grad = v.grad = None
        del out
    queue.put((min(times[1:]) * 1000, statistics.median(times[1:]) * 1000, (_hwm_kib() - start) / 1024))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[512, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = ap.parse_args()

    import torch
    import adaptor  # noqa: F401  (CPU patches, before forking)
    from megatron.core.transformer import dot_product_attention  # noqa: F401  (imported once, shared)
    from adaptor.ops import flash_attention  # noqa: F401

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.megatron_runs import free_port

    ctx = mp.get_context("fork")
    print(f"device: {platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, {args.dtype}, date {date.today()}")
    print("| heads | seq | DotProductAttention ms (median) | FlashAttention ms (median) | speed-up "
          "| DPA peak MiB | Flash peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        heads, groups, dim = SHAPES[shape]
        for seq in args.seqs:
            row = {}
            for impl in ("dpa", "flash"):
                queue = ctx.Queue()
                p = ctx.Process(target=_measure,
                                args=(impl, heads, groups, dim, seq, args.dtype, args.repeats, free_port(), queue))
                p.start()
                row[impl] = queue.get()
                p.join()
            (t_ref, med_ref, m_ref), (t_new, med_new, m_new) = row["dpa"], row["flash"]
            print(f"| {shape} | {seq} | {t_ref:.1f} ({med_ref:.1f}) | {t_new:.1f} ({med_new:.1f}) | {t_ref / t_new:.1f}x "
                  f"| {m_ref:.0f} | {m_new:.0f} |", flush=True)


if __name__ == "__main__":
    main()
