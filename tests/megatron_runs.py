"""Run pretrain_gpt.py through torchrun, as a user would, and read its loss curve."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

# A Qwen3-shaped model small enough for two CPU cores: GQA, qk-layernorm,
# kv-channels != hidden/heads, RMSNorm, SwiGLU, RoPE base 1e6, tied embeddings.
TINY_QWEN3 = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "192",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--kv-channels", "32", "--qk-layernorm", "--normalization", "RMSNorm", "--swiglu",
    "--disable-bias-linear", "--position-embedding-type", "rope", "--rotary-base", "1000000",
    "--seq-length", "64", "--max-position-embeddings", "64",
    "--attention-dropout", "0", "--hidden-dropout", "0",
    "--micro-batch-size", "2", "--global-batch-size", "8",
    "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--clip-grad", "1.0",
    "--seed", "1234", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000",
]
TINY_QWEN3_MODEL = list(TINY_QWEN3)  # without data: for runs on real datasets
TINY_QWEN3 += ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512"]
# The corpus and tokenizer the repository carries (examples/data/README.md).
SAMPLE_CORPUS = ROOT / "examples" / "data" / "sample_corpus.jsonl"
SAMPLE_TOKENIZER = ROOT / "examples" / "data" / "tokenizer"

_LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?lm loss: ([0-9.Ee+-]+)")


@dataclass
class Run:
    returncode: int
    output: str
    losses: dict[int, float]

    def curve(self) -> list[float]:
        return [self.losses[i] for i in sorted(self.losses)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pretrain(args: list[str], nproc: int = 1, env: dict | None = None, timeout: int = 600,
                 script: str = "pretrain_gpt.py") -> Run:
    cmd = TORCHRUN + [f"--nproc_per_node={nproc}", f"--master_port={free_port()}", str(ROOT / script)] + args
    full_env = dict(os.environ, ADAPTOR_BACKEND="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    losses = {int(i): float(v) for i, v in _LOSS.findall(output)}
    return Run(proc.returncode, output, losses)


def tail(text: str, n: int = 60) -> str:
    return "\n".join(text.splitlines()[-n:])
