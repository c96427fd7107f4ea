"""Per-rank memory and step time of FSDP2 against DDP, two data-parallel ranks.

    python benchmarks/fsdp2_memory.py [--iters 8] [--warmup 3] [--backend cpu] [--only tiny|0.6b-4l ...]

Each row is one `torchrun --nproc_per_node 2 pretrain_gpt.py` run on mock data, fp32, with
ADAPTOR_REPORT_MEMORY=1, which makes every rank print the bytes of parameters, gradients and
optimizer state it holds after the first step (local shards for FSDP2) and its peak resident
memory (and the accelerator allocator's peak on CUDA/NPU) at the end. We report the largest rank,
and the median of Megatron's "elapsed time per iteration" after the warm-up iterations.

Models: "tiny" is the Qwen3 example's tiny model (4 layers, hidden 128, vocabulary 4096, seq 128,
global batch 16); "0.6b-4l" has Qwen3-0.6B's layer and vocabulary shapes (hidden 1024, 16 heads,
8 KV heads, head dim 128, FFN 3072, vocabulary 151936, tied embeddings) with 4 layers instead of
28 so that two DDP copies fit a small machine (seq 256, global batch 4).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.megatron_runs import TORCHRUN, free_port  # noqa: E402

QWEN3 = ["--group-query-attention", "--qk-layernorm", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
         "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope", "--rotary-base", "1000000",
         "--attention-dropout", "0", "--hidden-dropout", "0", "--init-method-std", "0.02",
         "--mock-data", "--tokenizer-type", "NullTokenizer", "--lr", "1e-4", "--min-lr", "1e-5",
         "--clip-grad", "1.0", "--seed", "1234", "--log-interval", "1", "--eval-iters", "0",
         "--eval-interval", "100000"]
MODELS = {
    "tiny": ["--num-layers", "4", "--hidden-size", "128", "--ffn-hidden-size", "384", "--num-attention-heads", "4",
             "--num-query-groups", "2", "--kv-channels", "32", "--vocab-size", "4096", "--seq-length", "128",
             "--max-position-embeddings", "128", "--micro-batch-size", "4", "--global-batch-size", "16"],
    "0.6b-4l": ["--num-layers", "4", "--hidden-size", "1024", "--ffn-hidden-size", "3072",
                "--num-attention-heads", "16", "--num-query-groups", "8", "--kv-channels", "128",
                "--vocab-size", "151936", "--seq-length", "256", "--max-position-embeddings", "256",
                "--micro-batch-size", "1", "--global-batch-size", "4"],
}
CONFIGS = {
    "DDP": [],
    "DDP + distributed optimizer": ["--use-distributed-optimizer"],
    "FSDP2": ["--use-torch-fsdp2"],
}
_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
_STATE = re.compile(r"model state rank \d+: parameters (\d+), gradients (\d+), optimizer (\d+), total (\d+) bytes")
_PEAK = re.compile(r"peak memory rank \d+: RSS ([0-9.]+) MiB(?:, \w+ allocated ([0-9.]+) MiB)?")
MIB = 2**20


def measure(model, extra, iters, warmup, backend):
    cmd = TORCHRUN + ["--nproc_per_node=2", f"--master_port={free_port()}", str(ROOT / "pretrain_gpt.py"),
                      *QWEN3, *MODELS[model], "--train-iters", str(iters), *extra]
    env = dict(os.environ, ADAPTOR_BACKEND=backend, ADAPTOR_REPORT_MEMORY="1",
               OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // 2)))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    times = [float(x) for x in _MS.findall(out)]
    states = [tuple(map(int, s)) for s in _STATE.findall(out)]
    peaks = _PEAK.findall(out)
    if proc.returncode != 0 or len(times) < iters or len(states) != 2 or len(peaks) != 2:
        raise SystemExit(f"run failed ({model}, {extra}):\n{out[-3000:]}")
    state = max(states, key=lambda s: s[3])
    rss = max(float(p[0]) for p in peaks)
    device = max((float(p[1]) for p in peaks if p[1]), default=None)
    return state, rss, device, statistics.median(times[warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "npu"])
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS), help="run just these models")
    a = ap.parse_args()
    print(f"# {date.today()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores · "
          f"backend {a.backend} · 2 ranks · fp32 · median of iterations {a.warmup + 1}..{a.iters}")
    print("| model | configuration | model state / rank, MiB (params + grads + optimizer) | "
          "peak RSS / rank, MiB | device peak / rank, MiB | ms / iteration |\n|---|---|---|---|---|---|")
    for model in MODELS:
        if a.only and model not in a.only:
            continue
        for name, extra in CONFIGS.items():
            (p, g, o, total), rss, device, ms = measure(model, extra, a.iters, a.warmup, a.backend)
            parts = " + ".join(f"{x / MIB:.1f}" for x in (p, g, o))
            device_text = f"{device:.0f}" if device is not None else "–"
            print(f"| {model} | {name} | {total / MIB:.1f} ({parts}) | {rss:.0f} | {device_text} | {ms:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
