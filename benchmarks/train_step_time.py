"""Step time of the tiny Qwen3 example per layout and precision, from Megatron's own log.

    python benchmarks/train_step_time.py [--iters 30] [--warmup 5] [--backend cpu] [--only NAME ...]

Each configuration is one run of `bash examples/qwen3/pretrain.sh` (the tiny model:
4 layers, hidden 128, seq 128, global batch 16, the embedded corpus), with NPROC/TP/PP/PRECISION
set and, for the "fused" rows, the fused-operator flags appended. Megatron prints "elapsed time per
iteration (ms)" every iteration; we report the median after the warm-up iterations and the tokens
per second it implies.
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
from helpers.megatron_runs import free_port  # noqa: E402

FUSED = ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-flash-attn",
         "--cross-entropy-loss-fusion"]
CONFIGS = {  # name: (processes, extra environment for the example script, extra arguments)
    "1 proc fp32": (1, {}, []),
    "1 proc fp32, fused": (1, {}, FUSED),
    "1 proc bf16": (1, {"PRECISION": "bf16"}, []),
    "1 proc bf16, fused": (1, {"PRECISION": "bf16"}, FUSED),
    "TP=2 fp32": (2, {"TP": "2"}, []),
    "TP=2 fp32, fused": (2, {"TP": "2"}, FUSED),
    "PP=2 fp32": (2, {"PP": "2"}, []),
    "DP=2 fp32 + distributed optimizer": (2, {}, []),
}
_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
TOKENS_PER_ITERATION = 16 * 128  # the tiny example's global batch x sequence length


def measure(nproc, extra_env, extra_args, iters, warmup, backend, script="examples/qwen3/pretrain.sh"):
    """Median "elapsed time per iteration" (ms) after `warmup` iterations of one run of `script`."""
    env = dict(os.environ, ADAPTOR_BACKEND=backend, NPROC=str(nproc), TRAIN_ITERS=str(iters),
               LOG_INTERVAL="1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // nproc)),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], **extra_env)
    out = subprocess.run(["bash", script, *extra_args], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    times = [float(x) for x in _MS.findall(out.stdout + out.stderr)]
    if out.returncode != 0 or len(times) < iters:
        raise SystemExit(f"run failed ({extra_env or 'baseline'}):\n{(out.stdout + out.stderr)[-3000:]}")
    return statistics.median(times[warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "npu"])
    ap.add_argument("--only", nargs="+", choices=sorted(CONFIGS), help="run just these configurations")
    a = ap.parse_args()
    print(f"# {date.today()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores · "
          f"backend {a.backend} · median of iterations {a.warmup + 1}..{a.iters}")
    print("| configuration | ms / iteration | tokens / s |\n|---|---|---|")
    for name, (nproc, extra, args) in CONFIGS.items():
        if a.only and name not in a.only:
            continue
        ms = measure(nproc, extra, args, a.iters, a.warmup, a.backend)
        print(f"| {name} | {ms:.1f} | {TOKENS_PER_ITERATION / ms * 1000:.0f} |", flush=True)


if __name__ == "__main__":
    main()
