"""MoE operators, fused against unfused: forward+backward time on this machine's CPU.

    python benchmarks/moe_ops.py [--tokens 4096] [--experts 8] [--topk 2] [--hidden 512]
                                 [--ffn 256] [--dtype fp32|bf16] [--repeat 10] [--threads N] [--act-fusion]

Rows (median over --repeat after 2 warm-up calls, fused and unfused calls interleaved;
one process, megatron-core's modules):

* experts: megatron's SequentialMLP against our GroupedExperts (``--moe-grouped-gemm``),
  SwiGLU, same weights, on ``tokens * topk`` permuted rows split unevenly over the experts;
  plus the grouped-matmul kernels alone: our CPU loop against ``bmm`` on zero-padded groups;
* permute: moe_utils.permute + unpermute (with probs, unfused) against
  adaptor.ops.moe_permute (``--moe-permute-fusion``), routing from a top-k over random logits.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("ADAPTOR_BACKEND", "cpu")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import adaptor  # noqa: E402,F401
from helpers.megatron_runs import free_port  # noqa: E402


def timed_pair(f0, f1, repeat):
    """Median ms of each, calls interleaved so that load from other processes hits both alike."""
    for _ in range(2):
        f0(), f1()
    times = ([], [])
    for _ in range(repeat):
        for fn, ts in ((f0, times[0]), (f1, times[1])):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return tuple(statistics.median(ts) * 1000.0 for ts in times)


def uneven_counts(total, n, gen):
    w = torch.rand(n, generator=gen) + 0.5
    counts = (w / w.sum() * total).floor().long()
    counts[0] += total - counts.sum()
    return counts


def experts_rows(a, dtype, gen):
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.transformer_config import TransformerConfig

    from adaptor.ops.grouped_matmul import GroupedExperts, grouped_matmul

    torch.distributed.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    ps.initialize_model_parallel()
    pg = ProcessGroupCollection.use_mpu_process_groups()
    cfg = TransformerConfig(num_layers=1, hidden_size=a.hidden, num_attention_heads=8, num_moe_experts=a.experts,
                            moe_ffn_hidden_size=a.ffn, ffn_hidden_size=a.ffn, gated_linear_unit=True,
                            activation_func=F.silu, add_bias_linear=False, bias_activation_fusion=a.act_fusion,
                            use_cpu_initialization=True, params_dtype=dtype)
    sub = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    seq = SequentialMLP(a.experts, cfg, sub, pg_collection=pg)
    grp = GroupedExperts(a.experts, cfg, sub, pg_collection=pg)
    grp.load_state_dict(seq.state_dict())
    rows = a.tokens * a.topk
    counts = uneven_counts(rows, a.experts, gen)
    x = torch.randn(rows, a.hidden, generator=gen).to(dtype).requires_grad_()
    probs = torch.rand(rows, generator=gen).requires_grad_()
    dy = torch.randn(rows, a.hidden, generator=gen).to(dtype)

    def step(m):
        def run():
            y, _ = m(x, counts, probs)
            y.backward(dy)
        return run

    t0, t1 = timed_pair(step(seq), step(grp), a.repeat)
    out = [("experts fwd+bwd", "SequentialMLP", t0, "GroupedExperts", t1)]

    w = [e.linear_fc1.weight.detach().clone().requires_grad_() for e in seq.local_experts]
    dz = torch.randn(rows, w[0].shape[0], generator=gen).to(dtype)
    cl = counts.tolist()

    def loop():
        grouped_matmul(x, w, counts).backward(dz)

    def padded_bmm():
        cap = max(cl)
        xs = torch.split(x, cl)
        xp = torch.stack([F.pad(t, (0, 0, 0, cap - t.shape[0])) for t in xs])
        yp = torch.bmm(xp, torch.stack(w).transpose(1, 2))
        y = torch.cat([yp[e, :c] for e, c in enumerate(cl)])
        y.backward(dz)

    t0, t1 = timed_pair(padded_bmm, loop, a.repeat)
    out.append(("fc1 grouped matmul fwd+bwd", "bmm on padded groups", t0, "loop of mm (ours)", t1))
    return out


def permute_rows(a, dtype, gen):
    from megatron.core.transformer.moe import moe_utils

    from adaptor.ops import moe_permute

    logits = torch.randn(a.tokens, a.experts, generator=gen)
    top = logits.topk(a.topk, dim=1).indices
    routing_map = torch.zeros(a.tokens, a.experts, dtype=torch.bool).scatter_(1, top, True)
    probs = torch.zeros(a.tokens, a.experts).scatter_(1, top, torch.rand(a.tokens, a.topk, generator=gen))
    probs.requires_grad_()
    tokens = torch.randn(a.tokens, a.hidden, generator=gen).to(dtype).requires_grad_()
    num_out = a.tokens * a.topk

    def unfused():
        out, _, idx, _, _ = moe_utils.permute(tokens, routing_map, num_out_tokens=num_out)
        moe_utils.unpermute(out, idx, tokens.shape, probs=probs, routing_map=routing_map).sum().backward()

    def fused():
        out, _, idx = moe_permute.permute(tokens, routing_map, None, num_out)
        moe_permute.unpermute(out, idx, tokens.shape, probs=probs).sum().backward()

    t0, t1 = timed_pair(unfused, fused, a.repeat)
    return [("permute+unpermute fwd+bwd", "moe_utils (unfused)", t0, "adaptor.ops.moe_permute", t1)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--act-fusion", action="store_true",
                   help="megatron's jit-fused weighted SwiGLU in the experts (as --swiglu runs use)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    rows = experts_rows(a, dtype, gen) + permute_rows(a, dtype, gen)
    print(f"# {date.today()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {a.dtype}; tokens {a.tokens}, experts {a.experts}, top-{a.topk}, "
          f"hidden {a.hidden}, moe ffn {a.ffn}, act fusion {a.act_fusion}")
    print("| op | unfused | ms | fused | ms | speed-up |")
    print("|---|---|---:|---|---:|---:|")
    for op, n0, t0, n1, t1 in rows:
        print(f"| {op} | {n0} | {t0:.2f} | {n1} | {t1:.2f} | {t0 / t1:.2f}x |")


if __name__ == "__main__":
    main()
