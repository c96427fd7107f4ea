"""Peak memory per rank with and without each memory feature, Qwen3-0.6B shape, one process.

    python benchmarks/memory_features.py [--seq 4096] [--only NAME ...] [--precision bf16]

Each row is one ``pretrain_gpt.py`` run of two iterations (the second holds activations and Adam
state at once, the steady state) on mock data with ``ADAPTOR_REPORT_MEMORY=1``; the table gives the
peak resident memory (VmHWM) the run reports at its end, the time of the second iteration, and the
model state it reports after the first step. A run that does not fit is reported as such (killed
by the kernel's out-of-memory handling, or a Python ``MemoryError``).

On CPU the device is host memory: activation and optimizer offload move tensors to another place in
the same memory, so they cannot lower this peak. Their rows show what they move (the runs print the
offloaded bytes), which is what would leave an accelerator's memory.
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
from step_vs_transformers import cpu_description  # noqa: E402

SHAPES = {  # layers hidden ffn heads kv-heads head-dim vocabulary (tied embeddings)
    "0.6b": (28, 1024, 3072, 16, 8, 128, 151936),
    "small": (4, 256, 768, 4, 2, 64, 32000),  # a quick check of the script itself
}
CONFIGS = {
    "baseline": [],
    "recompute full (uniform, 1 layer)": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                          "--recompute-num-layers", "1"],
    "recompute selective (core_attn)": ["--recompute-granularity", "selective"],
    "recompute activation function": ["--recompute-activation-function"],
    "recompute norm": ["--recompute-norm"],
    "activation offload (core_attn, attn_proj, mlp_norm)": [
        "--fine-grained-activation-offloading", "--offload-modules", "core_attn", "attn_proj", "mlp_norm"],
    "swap attention": ["--swap-attention"],
    "optimizer offload (fraction 1.0)": ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"],
}
_PEAK = re.compile(r"peak memory rank 0: RSS ([0-9.]+) MiB")
_STATE = re.compile(r"model state rank 0: (.*) bytes")
_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
_OFFLOAD = re.compile(r"(offload[^\n]*?[0-9.]+ ?[KMG]i?B[^\n]*)", re.IGNORECASE)


def model_args(shape, seq) -> list[str]:
    """The Qwen3-shaped model of SHAPES[shape] at sequence ``seq``, in pretrain_gpt.py's flags."""
    layers, hidden, ffn, heads, kv, head_dim, _ = SHAPES[shape]
    return [
        "--num-layers", str(layers), "--hidden-size", str(hidden), "--ffn-hidden-size", str(ffn),
        "--num-attention-heads", str(heads), "--group-query-attention", "--num-query-groups", str(kv),
        "--kv-channels", str(head_dim), "--qk-layernorm", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
        "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope", "--rotary-base", "1000000",
        "--seq-length", str(seq), "--max-position-embeddings", str(seq),
    ]


def run(shape, seq, precision, extra, flash):
    vocab = SHAPES[shape][-1]
    args = [
        *model_args(shape, seq),
        "--attention-dropout", "0", "--hidden-dropout", "0", "--micro-batch-size", "1", "--global-batch-size", "1",
        "--train-iters", "2", "--lr", "1e-4", "--clip-grad", "1.0",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 1),
        "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000000",
        "--cross-entropy-loss-fusion", *(["--use-flash-attn"] if flash else []),
        *(["--bf16"] if precision == "bf16" else []), *extra,
    ]
    env = dict(os.environ, ADAPTOR_BACKEND="cpu", ADAPTOR_REPORT_MEMORY="1")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
              "--master_port", str(free_port()), "pretrain_gpt.py"]
    out = subprocess.run([*launch, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    peak, times = _PEAK.search(text), _MS.findall(text)
    if out.returncode != 0 or peak is None:
        why = "out of memory" if ("MemoryError" in text or "Killed" in text or out.returncode in (-9, 137)
                                  or "exitcode  : -9" in text) else f"failed (exit {out.returncode})"
        return None, None, why, text
    state = _STATE.search(text)
    offload = "; ".join(dict.fromkeys(m.strip() for m in _OFFLOAD.findall(text)))[:200]
    return float(peak.group(1)), float(times[-1]) if times else None, (state.group(1) if state else "") + \
        (f" · {offload}" if offload else ""), text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="0.6b", choices=sorted(SHAPES))
    ap.add_argument("--seq", type=int, nargs="+", default=[4096])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--no-flash", action="store_true", help="megatron-core's unfused attention (s x s scores)")
    ap.add_argument("--only", nargs="+", choices=sorted(CONFIGS))
    ap.add_argument("--log", help="append every run's output to this file")
    a = ap.parse_args()
    print(f"# {date.today()} · {cpu_description()} · shape {a.shape} {SHAPES[a.shape]} · {a.precision} · "
          f"micro-batch 1 · {'unfused' if a.no_flash else 'flash'} attention · 2 iterations")
    print("| sequence | configuration | peak RSS (MiB) | iteration 2 (s) | model state / offloaded |")
    print("|---|---|---|---|---|")
    for seq in a.seq:
        for name, extra in CONFIGS.items():
            if a.only and name not in a.only:
                continue
            peak, ms, note, text = run(a.shape, seq, a.precision, extra, not a.no_flash)
            if a.log:
                with open(a.log, "a") as f:
                    f.write(f"\n===== {seq} {name}\n{text}")
            shown = f"{peak:.0f}" if peak is not None else "-"
            secs = f"{ms / 1000:.1f}" if ms is not None else "-"
            print(f"| {seq} | {name} | {shown} | {secs} | {note} |", flush=True)


if __name__ == "__main__":
    main()
