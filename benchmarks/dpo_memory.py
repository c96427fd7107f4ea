"""Peak memory of DPO's reference: an in-memory copy against precomputed log-probabilities.

    python benchmarks/dpo_memory.py [--shape 0.6b] [--seq 256] [--pairs 8] [--precision bf16]

A random-weight Qwen3 of the shape (a Hugging Face directory) and a synthetic pairwise dataset (random
token ids, prompt 3/8 of each side) are written to a temporary directory; then each row is one
one-process ``posttrain_gpt.py --stage dpo`` run of two iterations from ``--hf-load-dir`` with
``ADAPTOR_REPORT_MEMORY=1``, which prints the policy's parameters, gradients and optimizer state after
the first step and the process's peak resident memory at its end:

* ``in-memory reference``: the default, a frozen copy of the starting weights beside the policy;
* ``--precompute-ref-logps``: the reference's values computed before the first step on the policy
  itself, then read back (no copy);
* ``--ref-logps``: a later run reading that file (no reference model at all);
* ``LoRA``: the reference is the model with its adapters off (no copy either).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from helpers.megatron_runs import free_port  # noqa: E402
from memory_features import SHAPES, model_args  # noqa: E402
from step_vs_transformers import cpu_description  # noqa: E402

LORA = ["--lora-r", "16", "--lora-alpha", "32",
        "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
_STATE = re.compile(r"model state rank 0: parameters (\d+), gradients (\d+), optimizer (\d+)")
_PEAK = re.compile(r"peak memory rank 0: RSS ([0-9.]+) MiB")
_COPY = re.compile(r"DPO reference: a second model in memory, (\d+) parameters")
_ITER = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")


def write_model(directory: Path, shape: str, precision: str) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    layers, hidden, ffn, heads, kv, head_dim, vocab = SHAPES[shape]
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                         max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16 if precision == "bf16" else torch.float32)
    model.save_pretrained(directory)


def write_pairs(prefix: str, pairs: int, seq: int, vocab: int) -> None:
    """Each side ``seq`` tokens: a shared prompt (3/8), then its own response, labelled."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(0)
    prompt_len = seq * 3 // 8
    builders = {f"{side}_{kind}": IndexedDatasetBuilder(f"{prefix}_packed_{side}_{kind}_document.bin", dtype=np.int32)
                for side in ("chosen", "rejected") for kind in ("input_ids", "labels")}
    for _ in range(pairs):
        prompt = rng.integers(2, vocab - 1, prompt_len)
        for side in ("chosen", "rejected"):
            ids = np.concatenate([prompt, rng.integers(2, vocab - 1, seq - prompt_len)]).astype(np.int32)
            labels = ids.copy()
            labels[:prompt_len] = -100
            builders[f"{side}_input_ids"].add_document(ids, [len(ids)])
            builders[f"{side}_labels"].add_document(labels, [len(labels)])
    for name, builder in builders.items():
        builder.finalize(f"{prefix}_packed_{name}_document.idx")


def run(model_dir: Path, data: str, shape: str, seq: int, pairs: int, precision: str, extra: list):
    vocab = SHAPES[shape][-1]
    args = [
        *model_args(shape, seq), "--hf-load-dir", str(model_dir),
        "--attention-dropout", "0", "--hidden-dropout", "0", "--micro-batch-size", "1",
        "--global-batch-size", str(pairs // 2), "--train-iters", "2", "--lr", "1e-6", "--clip-grad", "1.0",
        "--data-path", data, "--split", "100,0,0", "--stage", "dpo", "--is-pairwise-dataset",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 1),
        "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000000",
        "--cross-entropy-loss-fusion", "--use-flash-attn", *(["--bf16"] if precision == "bf16" else []), *extra,
    ]
    env = dict(os.environ, ADAPTOR_BACKEND="cpu", ADAPTOR_REPORT_MEMORY="1", OMP_NUM_THREADS="2")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
              "--master_port", str(free_port()), "posttrain_gpt.py"]
    out = subprocess.run([*launch, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    state, peak = _STATE.search(text), _PEAK.search(text)
    if out.returncode != 0 or not state or not peak:
        return None, text
    copy = _COPY.search(text)
    times = [float(t) for t in _ITER.findall(text)]
    return {"state": [int(x) / 2 ** 30 for x in state.groups()], "peak": float(peak.group(1)),
            "copy": int(copy.group(1)) if copy else 0, "second_ms": times[-1] if times else None}, text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.6b", choices=sorted(SHAPES))
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, data, logps = Path(tmp) / "model", str(Path(tmp) / "pairs"), str(Path(tmp) / "ref.logps")
        write_model(model_dir, opts.shape, opts.precision)
        write_pairs(data, opts.pairs, opts.seq, SHAPES[opts.shape][-1])
        rows = [("in-memory reference", []), ("--precompute-ref-logps", ["--precompute-ref-logps", logps]),
                ("--ref-logps", ["--ref-logps", logps]), ("LoRA, adapters off", LORA)]
        print(f"{date.today()} | {cpu_description()} | shape {opts.shape}, seq {opts.seq}, {opts.precision}, "
              f"{opts.pairs} pairs, global batch {opts.pairs // 2}, 1 process\n")
        print("| reference | second model (parameters) | parameters (GiB) | gradients (GiB) | optimizer state (GiB) "
              "| peak RSS (MiB) | second iteration (ms) |")
        print("|---|---|---|---|---|---|---|")
        for name, extra in rows:
            result, text = run(model_dir, data, opts.shape, opts.seq, opts.pairs, opts.precision, extra)
            if result is None:
                print(f"| {name} | failed: {text.strip().splitlines()[-1] if text.strip() else '?'} |", flush=True)
                continue
            params, grads, optim = result["state"]
            print(f"| {name} | {result['copy'] or 'none'} | {params:.3f} | {grads:.3f} | {optim:.3f} | "
                  f"{result['peak']:.0f} | {result['second_ms']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
