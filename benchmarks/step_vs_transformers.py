"""Tokens/s and MFU of one training step: pretrain_gpt.py against a plain transformers loop, same model.

    python benchmarks/step_vs_transformers.py [--precisions fp32 bf16] [--iters 12] [--warmup 4]
        [--variants unfused fused] [--layers 8 --hidden 512 ...]

Both sides train the same Qwen3 shape (default: hidden 512, 8 layers, 8 heads / 4 KV of 64, ffn
1536, vocabulary 32000, untied, sequence 512, micro-batch 4 = 2048 tokens per step, Adam):

* "transformers eager": ``Qwen3ForCausalLM`` with ``attn_implementation="eager"``, the loop a user
  writes by hand (forward with labels, backward, clip to 1.0, ``torch.optim.AdamW`` step,
  ``zero_grad``); bf16 under ``torch.autocast`` with fp32 weights, as Megatron's ``--bf16`` keeps
  fp32 master weights.
* ``pretrain_gpt.py``: one process, mock data, the same hyper-parameters; the "fused" variant adds
  the fused-operator flags. The step time is the median of Megatron's "elapsed time per iteration"
  after the warm-up.

MFU = model FLOP/s / the matmul peak measured in this same process before anything runs (the best
of a few square and model-shaped matmuls in the precision). Model FLOPs per step are counted the same
way for both sides: 6 x tokens x matmul weights + 12 x layers x micro-batch x sequence^2 x
(heads x head-dim) for attention scores and values (causal masking is not subtracted).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.megatron_runs import free_port  # noqa: E402

FUSED = ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-flash-attn",
         "--cross-entropy-loss-fusion"]
_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")


def cpu_description() -> str:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", platform.machine(), "x86_64"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    bf16 = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return f"{model}, {os.cpu_count()} cores, bf16 instructions: {', '.join(bf16) or 'none'}"


def matmul_peak(dtype: torch.dtype, shapes, seconds: float = 0.5) -> float:
    """Best FLOP/s over `shapes` (m, k, n), each timed for about `seconds`."""
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        a @ b
        reps, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            a @ b
            reps += 1
        best = max(best, 2 * m * k * n * reps / elapsed)
    return best


def model_flops(a) -> float:
    """Training FLOPs of one step (see the module docstring)."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    per_layer = a.hidden * (q + 2 * kv) + q * a.hidden + 3 * a.hidden * a.ffn
    weights = a.layers * per_layer + a.hidden * a.vocab  # the output layer; the embedding is a lookup
    tokens = a.mbs * a.seq
    return 6 * tokens * weights + 12 * a.layers * a.mbs * a.seq ** 2 * q


def transformers_step_ms(a, precision: str) -> float:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, head_dim=a.head_dim, max_position_embeddings=a.seq,
                         tie_word_embeddings=False, rope_theta=1e6, attention_dropout=0.0)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ids = torch.randint(0, a.vocab, (a.mbs, a.seq))
    times = []
    for _ in range(a.iters):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times[a.warmup:])


def megatron_step_ms(a, precision: str, extra) -> float:
    args = [
        "--num-layers", str(a.layers), "--hidden-size", str(a.hidden), "--ffn-hidden-size", str(a.ffn),
        "--num-attention-heads", str(a.heads), "--group-query-attention", "--num-query-groups", str(a.kv_heads),
        "--kv-channels", str(a.head_dim), "--qk-layernorm", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
        "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope", "--rotary-base", "1000000",
        "--untie-embeddings-and-output-weights", "--seq-length", str(a.seq), "--max-position-embeddings", str(a.seq),
        "--attention-dropout", "0", "--hidden-dropout", "0", "--micro-batch-size", str(a.mbs),
        "--global-batch-size", str(a.mbs), "--train-iters", str(a.iters), "--lr", "1e-4",
        "--weight-decay", "0.1", "--adam-beta2", "0.95", "--clip-grad", "1.0",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(a.vocab - 1),
        "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000000", *a.megatron_args,
    ]
    if precision == "bf16":
        args.append("--bf16")
    env = dict(os.environ, ADAPTOR_BACKEND="cpu")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
              "--master_port", str(free_port()), "pretrain_gpt.py"]
    out = subprocess.run([*launch, *args, *extra], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    times = [float(x) for x in _MS.findall(out.stdout + out.stderr)]
    if out.returncode != 0 or len(times) < a.iters:
        raise SystemExit(f"pretrain_gpt.py failed:\n{(out.stdout + out.stderr)[-3000:]}")
    return statistics.median(times[a.warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--variants", nargs="+", default=["unfused", "fused"], choices=["unfused", "fused"])
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--megatron-args", nargs=argparse.REMAINDER, default=[],
                    help="more pretrain_gpt.py flags for every Megatron row (last on the line)")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    tokens, flops = a.mbs * a.seq, model_flops(a)
    shapes = [(2048, 2048, 2048), (tokens, a.hidden, a.ffn), (tokens, a.ffn, a.hidden), (tokens, a.hidden, a.vocab)]
    print(f"# {date.today()} · {cpu_description()} · torch {torch.__version__} · {torch.get_num_threads()} threads")
    print(f"# model: {a.layers} layers, hidden {a.hidden}, ffn {a.ffn}, heads {a.heads}/{a.kv_heads}x{a.head_dim}, "
          f"vocab {a.vocab}, seq {a.seq}, micro-batch {a.mbs}; {flops / 1e9:.1f} GFLOP per step")
    print("| precision | loop | ms / step | tokens / s | TFLOP/s | MFU | vs transformers |")
    print("|---|---|---|---|---|---|---|")
    for precision in a.precisions:
        peak = matmul_peak(torch.float32 if precision == "fp32" else torch.bfloat16, shapes)
        print(f"# {precision} matmul peak measured: {peak / 1e12:.3f} TFLOP/s", flush=True)
        rows = [("transformers eager", transformers_step_ms(a, precision))]
        for variant in a.variants:
            rows.append((f"pretrain_gpt.py {variant}",
                         megatron_step_ms(a, precision, FUSED if variant == "fused" else [])))
        base = rows[0][1]
        for name, ms in rows:
            achieved = flops / (ms / 1000)
            print(f"| {precision} | {name} | {ms:.0f} | {tokens / ms * 1000:.0f} | {achieved / 1e12:.3f} | "
                  f"{achieved / peak:.0%} | {base / ms:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
