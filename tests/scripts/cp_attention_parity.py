"""Context-parallel attention against one-process attention, forward and backward, on gloo.

    torchrun --nproc_per_node N tests/scripts/cp_attention_parity.py --algo p2p|a2a|a2a+p2p [--ulysses K]

With ``ADAPTOR_BACKEND=npu`` (and the torch_npu stand-in on the path) the blocks run through
``npu_fusion_attention`` / ``npu_fusion_attention_grad``. Every rank builds the same full inputs from one seed, computes the reference on the whole
sequence with torch's SDPA math, takes its own CP chunks (Megatron's balanced split, per
sequence for packed inputs), runs ``adaptor.ops.context_parallel.attention`` and compares its
output and its gradients with the reference's chunks. Prints one ``CASE <name> max_err ...``
line per case and exits non-zero when any case is off by more than --tolerance.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if os.environ.get("ADAPTOR_BACKEND") == "npu":  # the kernels follow the adaptor's backend (torch_npu stand-in)
    import adaptor  # noqa: F401,E402

from adaptor.ops.context_parallel import CPGroups, attention  # noqa: E402


def balanced_index(lengths, cp, rank):
    """Token indices of CP rank ``rank`` in a stream of sequences of these (padded) lengths."""
    idx, start = [], 0
    for n in lengths:
        c = n // (2 * cp)
        for chunk in (rank, 2 * cp - 1 - rank):
            idx.extend(range(start + chunk * c, start + (chunk + 1) * c))
        start += n
    return torch.tensor(idx)


def reference(q, k, v, lengths, causal, scale):
    """[b, n, s, d] attention, per sequence when ``lengths`` is given (b == 1)."""
    if k.size(1) != q.size(1):
        k, v = (x.repeat_interleave(q.size(1) // x.size(1), 1) for x in (k, v))
    if lengths is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    outs, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        outs.append(F.scaled_dot_product_attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], is_causal=causal,
                                                   scale=scale))
        start += n
    return torch.cat(outs, 2)


def run_case(name, groups, cp, rank, *, b, heads, kv_heads, d, dv, lengths, causal, dtype, tol):
    torch.manual_seed(1234)
    total = sum(lengths)
    packed = len(lengths) > 1
    q = torch.randn(b, heads, total, d, dtype=dtype)
    k = torch.randn(b, kv_heads, total, d, dtype=dtype)
    v = torch.randn(b, kv_heads, total, dv, dtype=dtype)
    grad = torch.randn(b, heads, total, dv, dtype=dtype)
    scale = d ** -0.5
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = reference(*ref_in, lengths if packed else None, causal, scale)
    ref.backward(grad)
    idx = balanced_index(lengths, cp, rank)
    mine_in = [x.index_select(2, idx).clone().requires_grad_() for x in (q, k, v)]
    out = attention(*mine_in, groups, causal=causal, scale=scale, seq_lengths=lengths if packed else None)
    out.backward(grad.index_select(2, idx))
    # K/V gradients of the whole sequence come from every rank's queries: sum them.
    dk, dv_ = (torch.zeros_like(x).index_copy_(2, idx, m.grad) for x, m in zip((k, v), mine_in[1:]))
    dist.all_reduce(dk)
    dist.all_reduce(dv_)
    errors = {
        "out": (out - ref.detach().index_select(2, idx)).abs().max().item(),
        "dq": (mine_in[0].grad - ref_in[0].grad.index_select(2, idx)).abs().max().item(),
        "dk": (dk - ref_in[1].grad).abs().max().item(),
        "dv": (dv_ - ref_in[2].grad).abs().max().item(),
    }
    worst = max(errors.values())
    if rank == 0:
        print(f"CASE {name} max_err {worst:.3e} " + " ".join(f"{k}={v:.2e}" for k, v in errors.items()), flush=True)
    return worst <= tol


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--algo", choices=("p2p", "a2a", "a2a+p2p"), required=True)
    p.add_argument("--ulysses", type=int, default=2, help="Ulysses degree for a2a+p2p")
    p.add_argument("--tolerance", type=float, default=2e-5)
    a = p.parse_args()
    dist.init_process_group("gloo")
    cp, rank = dist.get_world_size(), dist.get_rank()
    if a.algo == "p2p":
        groups = CPGroups(cp, ring=dist.group.WORLD)
    elif a.algo == "a2a":
        groups = CPGroups(cp, ulysses=dist.group.WORLD)
    else:
        u, outer = a.ulysses, cp // a.ulysses
        inner_groups = [dist.new_group(list(range(j * u, (j + 1) * u))) for j in range(outer)]
        outer_groups = [dist.new_group(list(range(i, cp, u))) for i in range(u)]
        groups = CPGroups(cp, ulysses=inner_groups[rank // u], ring=outer_groups[rank % u])
    unit = 2 * cp
    cases = [
        ("causal", dict(b=2, heads=4, kv_heads=4, d=16, dv=16, lengths=[16 * unit], causal=True)),
        ("gqa", dict(b=1, heads=4, kv_heads=2, d=16, dv=16, lengths=[8 * unit], causal=True)),
        ("packed", dict(b=1, heads=4, kv_heads=2, d=16, dv=16, lengths=[3 * unit, 1 * unit, 7 * unit, 2 * unit],
                        causal=True)),
        ("mla_head_dims", dict(b=1, heads=4, kv_heads=4, d=24, dv=16, lengths=[8 * unit], causal=True)),
        ("non_causal", dict(b=1, heads=4, kv_heads=4, d=16, dv=16, lengths=[8 * unit], causal=False)),
    ]
    ok = all([run_case(name, groups, cp, rank, dtype=torch.float32, tol=a.tolerance, **kw) for name, kw in cases])
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
