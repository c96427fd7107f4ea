"""Model state per rank for full fine-tuning against LoRA, Qwen3-0.6B shape, through Megatron's loop.

    python benchmarks/lora_memory.py [--shape 0.6b] [--seq 512] [--layouts 1 tp2 dp2] [--precision bf16]

Each row is one ``pretrain_gpt.py`` run of two iterations on mock data with ``ADAPTOR_REPORT_MEMORY=1``:
after the first step every rank prints the bytes of parameters, gradients and optimizer state it holds
(``adaptor.memory_stats.model_state_bytes``: optimizer state is the fp32 main copies plus Adam's
moments), and at its end its peak resident memory. LoRA freezes the base weights before Megatron
wraps the model, so only the adapters get gradient buffers and optimizer state; the table shows
that per rank. On CPU the peak RSS also counts the activations and the Python/torch runtime.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from helpers.megatron_runs import free_port  # noqa: E402
from memory_features import SHAPES, model_args  # noqa: E402
from step_vs_transformers import cpu_description  # noqa: E402

LORA = ["--lora-r", "16", "--lora-alpha", "32",
        "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
LAYOUTS = {  # name -> (processes, flags)
    "1": (1, []),
    "tp2": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "dp2": (2, ["--use-distributed-optimizer"]),
}
_STATE = re.compile(r"model state rank (\d+): parameters (\d+), gradients (\d+), optimizer (\d+)")
_PEAK = re.compile(r"peak memory rank (\d+): RSS ([0-9.]+) MiB")
_TRAINABLE = re.compile(r"(LoRA r=[^\n]*parameters train[^\n]*)")


def run(shape, seq, precision, nproc, extra):
    vocab = SHAPES[shape][-1]
    args = [
        *model_args(shape, seq),
        "--attention-dropout", "0", "--hidden-dropout", "0", "--micro-batch-size", "1",
        "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-4", "--clip-grad", "1.0",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 1),
        "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000000",
        "--cross-entropy-loss-fusion", "--use-flash-attn", *(["--bf16"] if precision == "bf16" else []), *extra,
    ]
    env = dict(os.environ, ADAPTOR_BACKEND="cpu", ADAPTOR_REPORT_MEMORY="1", OMP_NUM_THREADS=str(max(1, 2 // nproc)))
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
              "--master_port", str(free_port()), "pretrain_gpt.py"]
    out = subprocess.run([*launch, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    states = {int(m[0]): tuple(int(x) for x in m[1:]) for m in _STATE.findall(text)}
    peaks = {int(m[0]): float(m[1]) for m in _PEAK.findall(text)}
    if out.returncode != 0 or not states:
        return None, text
    trainable = _TRAINABLE.search(text)
    return (states, peaks, trainable.group(1).strip() if trainable else ""), text


def gib(n: int) -> str:
    return f"{n / 2**30:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="0.6b", choices=sorted(SHAPES))
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--log", help="append every run's output to this file")
    a = ap.parse_args()
    print(f"# {date.today()} · {cpu_description()} · shape {a.shape} {SHAPES[a.shape]} · {a.precision} · "
          f"sequence {a.seq} · micro-batch 1 · LoRA r 16 on linear_qkv/proj/fc1/fc2")
    print("| layout | method | rank | parameters (GiB) | gradients (GiB) | optimizer state (GiB) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for layout in a.layouts:
        nproc, flags = LAYOUTS[layout]
        for method, extra in (("full", []), ("LoRA", LORA)):
            result, text = run(a.shape, a.seq, a.precision, nproc, [*flags, *extra])
            if a.log:
                with open(a.log, "a") as f:
                    f.write(f"\n===== {layout} {method}\n{text}")
            if result is None:
                why = ("out of memory (killed)" if "SIGKILL" in text or "MemoryError" in text
                       else f"failed: {text.strip().splitlines()[-1][:100]}")
                print(f"| {layout} | {method} | - | - | - | {why} | - |")
                continue
            states, peaks, trainable = result
            for rank, (params, grads, optim) in sorted(states.items()):
                peak = f"{peaks[rank]:.0f}" if rank in peaks else "-"
                print(f"| {layout} | {method} | {rank} | {gib(params)} | {gib(grads)} | {gib(optim)} | {peak} |",
                      flush=True)
            if trainable:
                print(f"<!-- {layout} {method}: {trainable} -->")


if __name__ == "__main__":
    main()
