"""Peak CPU memory and time of one cross-entropy forward+backward with a large vocabulary.

    python benchmarks/cross_entropy_memory.py [--vocab 151936] [--seq 4096] [--batch 1]
                                              [--dtype bf16 fp32] [--only ours ...]

Implementations, each in a fresh process (TP=1, a one-process gloo group):
  ours              adaptor.ops.cross_entropy (--cross-entropy-loss-fusion with the adaptor)
  megatron          megatron.core.tensor_parallel.vocab_parallel_cross_entropy (unfused, the default)
  megatron_fused    megatron.core.fusions.fused_cross_entropy (Megatron's native fused path, torch.compile)

The logits [seq, batch, vocab] come out of a stand-in output layer (an autograd Function that
makes them and whose backward only reduces its incoming gradient), so, as in training, nothing but
the loss holds them once the loss is computed, and the logits gradient is handed to an upstream
backward (which drops it).

Memory: resident set size (RSS) read from /proc/self/statm by a thread every 2 ms while one warm
forward+backward runs (after a first, untimed one: the allocator's pages and torch.compile's
kernels exist already); "peak" is the highest RSS minus the RSS just before the logits were made,
so it includes the logits themselves. The CPU allocator returns large blocks to the OS on free
(glibc mmap), so RSS follows tensor memory. ru_maxrss of the first (cold) run, minus the RSS
before it, is printed as a cross-check. Time: wall time of the loss's forward and backward (logits
generation excluded), median of --repeats warm runs; "first call" includes torch.compile.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("ours", "megatron", "megatron_fused")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakSampler(threading.Thread):
    def __init__(self, interval=0.002):
        super().__init__(daemon=True)
        self.interval, self.peak, self.stop = interval, rss(), threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(self.interval)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()
        self.peak = max(self.peak, rss())


def child(impl: str, dtype_name: str, seq: int, batch: int, vocab: int, repeats: int) -> dict:
    import adaptor  # noqa: F401  same patched process for all three (the flag is not on argv)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    group = dist.group.WORLD
    if impl == "ours":
        from adaptor.ops.cross_entropy import fused_vocab_parallel_cross_entropy as fn
    elif impl == "megatron":
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        def fn(logits, target, group):
            return vocab_parallel_cross_entropy(logits, target, tp_group=group)
    else:
        from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy as fn

    class OutputLayer(torch.autograd.Function):
        """Makes the logits; backward drops the logits gradient."""

        @staticmethod
        def forward(ctx, anchor, seed):
            gen = torch.Generator().manual_seed(seed)
            logits = torch.empty(seq, batch, vocab, dtype=dtype)
            for i in range(seq):  # in place, no fp32 temporary
                logits[i].normal_(0.0, 3.0, generator=gen)
            return logits

        @staticmethod
        def backward(ctx, grad):  # a real output layer would multiply; here the gradient just dies
            return torch.zeros_like(anchor), None

    anchor = torch.zeros(vocab, requires_grad=True)
    target = torch.randint(0, vocab, (seq, batch), generator=torch.Generator().manual_seed(1))

    def step(seed):
        """Forward+backward; returns (mean loss, seconds spent in the loss forward and backward)."""
        logits = OutputLayer.apply(anchor, seed)
        t0 = time.perf_counter()
        loss = fn(logits, target, group)
        del logits
        loss.sum().backward()
        return loss.detach().mean().item(), time.perf_counter() - t0

    result = {"impl": impl, "dtype": dtype_name, "logits_bytes": seq * batch * vocab * dtype.itemsize}
    before = rss()
    result["loss"], result["cold_s"] = step(0)
    result["cold_maxrss_delta"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    anchor.grad = None
    times, peaks = [], []
    for r in range(repeats):
        before = rss()
        with PeakSampler() as sampler:
            times.append(step(r + 1)[1])
        peaks.append(sampler.peak - before)
        anchor.grad = None
    result["warm_s"] = statistics.median(times)
    result["peak"] = max(peaks)
    dist.destroy_process_group()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    p.add_argument("--only", nargs="+", default=list(IMPLS), choices=IMPLS)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", nargs=2, metavar=("IMPL", "DTYPE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print("RESULT" + json.dumps(child(*a.child, a.seq, a.batch, a.vocab, a.repeats)), flush=True)
        return
    env = dict(os.environ, ADAPTOR_BACKEND="cpu", ADAPTOR_QUIET="1", PYTHONPATH=str(ROOT))
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    import torch

    gib = 2.0**30
    print(f"Device: {platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"date {date.today()}; vocab {a.vocab}, seq {a.seq}, micro-batch {a.batch}, "
          f"chunk {os.environ.get('ADAPTOR_CE_CHUNK_TOKENS', 'default')}\n")
    print("| logits | implementation | peak RSS over start (GiB) | of which logits (GiB) | "
          "cold ru_maxrss delta (GiB) | fwd+bwd warm (s) | first call (s) | mean loss |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in a.dtype:
        for impl in a.only:
            cmd = [sys.executable, __file__, "--child", impl, dtype, "--vocab", str(a.vocab),
                   "--seq", str(a.seq), "--batch", str(a.batch), "--repeats", str(a.repeats)]
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")]
            if proc.returncode or not lines:
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
                print(f"| {dtype} | {impl} | failed (exit {proc.returncode}) | | | | | |\n{tail}")
                continue
            r = json.loads(lines[-1][len("RESULT"):])
            print(f"| {dtype} | {impl} | {r['peak'] / gib:.2f} | {r['logits_bytes'] / gib:.2f} | "
                  f"{r['cold_maxrss_delta'] / gib:.2f} | {r['warm_s']:.2f} | {r['cold_s']:.2f} | "
                  f"{r['loss']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
