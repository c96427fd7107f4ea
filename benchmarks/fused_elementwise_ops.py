"""Per-op forward+backward time and saved-activation size, fused against megatron-core's unfused code, on CPU.

Ops: RMSNorm (hidden and qk-layernorm shapes), SwiGLU, RoPE (q), at the tiny
Qwen3 of the tests and at Qwen3-0.6B (hidden 1024, 16 heads of 128, ffn 3072)
with sequence 4096, micro-batch 1. "unfused" is what megatron-core runs
without the flag: torch.nn.RMSNorm (WrappedTorchNorm), the MLP's
``silu(a) * b``, ``_apply_rotary_pos_emb_bshd``. Time: best of --repeat runs
of forward + backward (after a warm-up); "saved" is the bytes autograd keeps
for backward.

    ADAPTOR_BACKEND=cpu python benchmarks/fused_elementwise_ops.py [--threads N] [--repeat R]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("ADAPTOR_BACKEND", "cpu")
os.environ.setdefault("ADAPTOR_QUIET", "1")
sys.argv = sys.argv[:1] + [a for a in sys.argv[1:]]  # adaptor pre-parses only its own flags

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import adaptor  # noqa: E402,F401
from adaptor.ops import rmsnorm, rope, swiglu  # noqa: E402
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd  # noqa: E402

SHAPES = {  # name: (seq, batch, hidden, heads, head_dim, ffn)
    "tiny-qwen3": (64, 2, 64, 4, 32, 192),
    "example-tiny": (128, 4, 128, 4, 32, 384),  # examples/qwen3/pretrain.sh MODEL_SIZE=tiny
    "qwen3-0.6b": (4096, 1, 1024, 16, 128, 3072),
}


def rope_freqs(seq, dim, base=1e6):
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    f = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return torch.cat((f, f), dim=-1)[:, None, None, :]


def saved_bytes(fn, x):
    sizes = {}

    def pack(t):
        sizes[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    del out
    return sum(sizes.values())


def best_time(fn, x, repeat):
    grad = None
    times = []
    for i in range(repeat + 1):
        xi = x.detach().requires_grad_()
        t0 = time.perf_counter()
        out = fn(xi)
        if grad is None:
            grad = torch.randn_like(out)
        out.backward(grad)
        if i:  # the first run is a warm-up
            times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def cases(seq, batch, hidden, heads, head_dim, ffn, dtype):
    torch.manual_seed(0)
    norm = torch.nn.RMSNorm(hidden, eps=1e-6).to(dtype)
    qk_norm = torch.nn.RMSNorm(head_dim, eps=1e-6).to(dtype)
    w, qk_w = norm.weight, qk_norm.weight
    freqs = rope_freqs(seq, head_dim)
    return [
        ("rmsnorm", torch.randn(seq, batch, hidden, dtype=dtype),
         lambda x: rmsnorm.rms_norm(x, w, 1e-6), norm),
        ("qk-rmsnorm", torch.randn(seq, batch, heads, head_dim, dtype=dtype),
         lambda x: rmsnorm.rms_norm(x, qk_w, 1e-6), qk_norm),
        ("swiglu", torch.randn(seq, batch, 2 * ffn, dtype=dtype),
         lambda x: swiglu.bias_swiglu_impl(x, None), lambda x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1]),
        ("rope", torch.randn(seq, batch, heads, head_dim, dtype=dtype),
         lambda x: rope.fused_apply_rotary_pos_emb(x, freqs), lambda x: _apply_rotary_pos_emb_bshd(x, freqs)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    print(f"torch {torch.__version__}, {opts.threads} threads, best of {opts.repeat}, forward+backward")
    print(f"| model | shape | dtype | op | unfused ms | fused ms | speed-up | saved MB unfused | saved MB fused |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in opts.models:
        for dtype in (torch.float32, torch.bfloat16):
            for name, x, fused, unfused in cases(*SHAPES[model], dtype):
                tu, tf = best_time(unfused, x, opts.repeat), best_time(fused, x, opts.repeat)
                su, sf = saved_bytes(unfused, x.requires_grad_()) / 2**20, saved_bytes(fused, x) / 2**20
                x.requires_grad_(False)
                print(f"| {model} | {'x'.join(map(str, x.shape))} | {str(dtype)[6:]} | {name} | {tu:.2f} | {tf:.2f} "
                      f"| {tu / tf:.2f}x | {su:.1f} | {sf:.1f} |", flush=True)


if __name__ == "__main__":
    main()
