"""One AdamW step over the 58M-parameter Qwen3 shape: torch's loop, foreach and fused kernels on CPU.

    python benchmarks/adam_step.py [--repeat 5]

Megatron without Transformer Engine or apex builds ``torch.optim.AdamW`` with neither ``foreach``
nor ``fused``; on CPU parameters torch then runs its single-tensor loop. The ``fused_adam``
feature switches the groups to ``fused=True``. Parameters: hidden 512, 8 layers, GQA 8/4 x 64,
ffn 1536, vocabulary 32000 untied (what ``benchmarks/step_vs_transformers.py`` trains), fp32.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_vs_transformers import cpu_description  # noqa: E402

LAYER = [(1024, 512), (512, 512), (3072, 512), (512, 1536), (512,), (512,), (64,), (64,)]  # qkv, proj, fc1, fc2, norms
SHAPES = [(32000, 512), (32000, 512), (512,)] + LAYER * 8


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    print(f"# {cpu_description()} · torch {torch.__version__} · {torch.get_num_threads()} threads · "
          f"{sum(torch.Size(s).numel() for s in SHAPES) / 1e6:.1f}M parameters")
    print("| kernel | ms / step |\n|---|---|")
    for name, kwargs in (("loop (Megatron's fallback)", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        params = [torch.nn.Parameter(torch.randn(*s)) for s in SHAPES]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kwargs)
        opt.step()
        times = []
        for _ in range(a.repeat):
            start = time.perf_counter()
            opt.step()
            times.append((time.perf_counter() - start) * 1000)
        print(f"| {name} | {statistics.median(times):.0f} |", flush=True)


if __name__ == "__main__":
    main()
