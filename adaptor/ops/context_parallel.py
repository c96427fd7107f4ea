"""Context-parallel attention without Transformer Engine: ring (p2p), Ulysses (a2a) and both (a2a+p2p).

Input and output are in Megatron's balanced layout (``get_batch_on_this_cp_rank``: CP rank r holds
chunks r and 2CP-1-r; packed documents split one by one, padded to 2 x CP as TE does),
[b, heads, s_local, d].

* **Ulysses** (``a2a``, MindSpeed's ``ulysses_cp_algo``): all-to-all from sequence split to head
  split, one ordinary attention call (any kernel, packed included), all-to-all back. Needs local
  heads divisible by the Ulysses degree.
* **Ring** (``p2p``, ``megatron_cp_algo``): key/value blocks circulate, each step merged by
  log-sum-exp; the balanced layout gives every rank equal work per step, and the next transfer
  overlaps the current compute.
* **Hybrid** (``a2a+p2p``, ``hybrid_cp_algo``): Ulysses inside Megatron's first hierarchical CP
  group, ring across groups.

Not torch's ``torch.distributed.tensor.experimental.context_parallel``: a private API that changes
between supported releases, DTensor-based, without packed inputs or torch_npu kernels. The kernels
are torch's own (``adaptor.ops.attention_kernels``).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from adaptor.ops import attention_kernels as kernels

#: The ``--cp-comm-type`` values implemented here (Megatron's ``allgather`` is not).
CP_COMM_TYPES = ("p2p", "a2a", "a2a+p2p")


# ----------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class RingLayout:
    """Where each sequence's halves lie in the local tensor of a balanced ring layout.

    ``cu`` holds cumulative local lengths per sequence (None for one dense sequence per batch
    row), ``half_cu`` the same for half-sequences; ``first``/``second`` index the first and
    second halves (None for dense rows, which are sliced instead).
    """

    length: int
    cu: Optional[tuple]
    half_cu: Optional[tuple]
    first: Optional[Tensor]
    second: Optional[Tensor]

    def take(self, x: Tensor, which: str) -> Tensor:
        h = self.length // 2
        if self.cu is None:
            return x[:, :, :h] if which == "first" else x[:, :, h:]
        return x.index_select(2, self.first if which == "first" else self.second)

    def put_second(self, acc: Tensor, value: Tensor) -> None:
        if self.cu is None:
            acc[:, :, self.length // 2:] = value
        else:
            acc.index_copy_(2, self.second, value)

    def add_to(self, acc: Tensor, which: str, value: Tensor) -> None:
        h = self.length // 2
        if self.cu is None:
            (acc[:, :, :h] if which == "first" else acc[:, :, h:]).add_(value)
        else:
            acc.index_add_(2, self.first if which == "first" else self.second, value)


def _cumulative(lengths: Sequence[int]) -> tuple:
    return tuple(itertools.accumulate(lengths, initial=0))


@functools.lru_cache(maxsize=64)
def ring_layout(local_lengths: Optional[tuple], length: int, device: str) -> RingLayout:
    """The halves of each sequence of a balanced layout (``local_lengths`` None: one dense row)."""
    if local_lengths is None:
        return RingLayout(length, None, None, None, None)
    first, second, start = [], [], 0
    for n in local_lengths:
        h = n // 2
        first.extend(range(start, start + h))
        second.extend(range(start + h, start + n))
        start += n
    as_index = functools.partial(torch.tensor, dtype=torch.long, device=device)
    return RingLayout(length, _cumulative(local_lengths), _cumulative([n // 2 for n in local_lengths]),
                      as_index(first), as_index(second))


@functools.lru_cache(maxsize=64)
def ulysses_order(seq_lengths: tuple, cp: int, degree: int, outer_rank: int, device: str) -> tuple[Tensor, Tensor]:
    """(gathered -> ring order, its inverse) after the all-to-all over ``degree`` consecutive CP ranks.

    ``seq_lengths`` are the full (padded) lengths of the sequences in the stream, each a multiple
    of 2 x cp. The gathered stream is inner rank 0's local tokens, then inner rank 1's, ...; each
    holds, per sequence, chunk c then chunk 2cp-1-c (c its CP rank). The ring order is, per
    sequence, the group's chunks in ascending order: the balanced layout of the outer ring.
    """
    local_total = sum(seq_lengths) // cp
    order, offset = [], 0
    for n in seq_lengths:
        chunk = n // (2 * cp)
        where = {}
        for i in range(degree):
            c = outer_rank * degree + i
            base = i * local_total + offset
            where[c] = base
            where[2 * cp - 1 - c] = base + chunk
        for c in sorted(where):
            order.extend(range(where[c], where[c] + chunk))
        offset += 2 * chunk
    perm = torch.tensor(order, dtype=torch.long)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    return perm.to(device), inverse.to(device)


# --------------------------------------------------------------------------- Ulysses
class _AllToAll(torch.autograd.Function):
    """[b, n, s, d] -> [b, n/U, U*s, d] (scatter heads, gather sequence) or the reverse."""

    @staticmethod
    def forward(ctx, x: Tensor, group, gather_sequence: bool) -> Tensor:
        ctx.group, ctx.gather_sequence = group, gather_sequence
        return _all_to_all(x, group, gather_sequence)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _all_to_all(grad.contiguous(), ctx.group, not ctx.gather_sequence), None, None


def _all_to_all(x: Tensor, group, gather_sequence: bool) -> Tensor:
    u = dist.get_world_size(group)
    b, n, s, d = x.shape
    if gather_sequence:
        send = x.reshape(b, u, n // u, s, d).transpose(0, 1).contiguous()
        recv = torch.empty(send.shape, dtype=send.dtype, device=send.device)
        dist.all_to_all_single(recv, send, group=group)
        return recv.permute(1, 2, 0, 3, 4).reshape(b, n // u, u * s, d)
    send = x.reshape(b, n, u, s // u, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty(send.shape, dtype=send.dtype, device=send.device)
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(0, 1).reshape(b, u * n, s // u, d)


# ------------------------------------------------------------------------------ ring
class _Ring:
    """Async send to the next rank and receive from the previous one, in one group."""

    def __init__(self, group):
        self.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (rank + 1) % size)
        self.prev = dist.get_global_rank(group, (rank - 1) % size)

    def shift(self, tensors: Sequence[Tensor]):
        received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        return received, dist.batch_isend_irecv(ops)


def _wait(requests) -> None:
    for r in requests:
        r.wait()


def _step_kind(step: int, src: int, rank: int, causal: bool) -> str:
    if not causal:
        return "full"
    if step == 0:
        return "diag"
    return "lower" if src < rank else "upper"


def _block(kind: str, layout: RingLayout, q: Tensor, k: Tensor, v: Tensor):
    """(q, k, v, causal, cu_q, cu_k, query half or None) of one ring step."""
    if kind == "diag":
        return q, k, v, True, layout.cu, layout.cu, None
    if kind == "full":
        return q, k, v, False, layout.cu, layout.cu, None
    if kind == "lower":  # a lower rank's block: every local query sees its first halves
        return q, layout.take(k, "first"), layout.take(v, "first"), False, layout.cu, layout.half_cu, None
    return layout.take(q, "second"), k, v, False, layout.half_cu, layout.cu, "second"  # a higher rank's


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, group, layout: RingLayout, causal: bool, scale: float):
        ring, size, rank = _Ring(group), dist.get_world_size(group), dist.get_rank(group)
        out = lse = None
        k_cur, v_cur = k, v
        for step in range(size):
            if step < size - 1:
                (k_next, v_next), requests = ring.shift((k_cur, v_cur))
            kind = _step_kind(step, (rank - step) % size, rank, causal)
            bq, bk, bv, bcausal, cu_q, cu_k, half = _block(kind, layout, q, k_cur, v_cur)
            o, l_ = kernels.forward(bq, bk, bv, bcausal, scale, cu_q, cu_k)
            if out is None:
                out, lse = o.float(), l_
            elif half is None:
                out, lse = kernels.merge(out, lse, o, l_)
            else:  # the second half of the queries only
                part_out, part_lse = kernels.merge(layout.take(out, half), layout.take(lse, half), o, l_)
                layout.put_second(out, part_out)
                layout.put_second(lse, part_lse)
            if step < size - 1:
                _wait(requests)
                k_cur, v_cur = k_next, v_next
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.layout, ctx.causal, ctx.scale = group, layout, causal, scale
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        layout, causal, scale = ctx.layout, ctx.causal, ctx.scale
        ring, size, rank = _Ring(ctx.group), dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        dk = torch.zeros_like(k, dtype=torch.float32)
        dv = torch.zeros_like(v, dtype=torch.float32)
        k_cur, v_cur = k, v
        for step in range(size):
            if step < size - 1:
                (k_next, v_next), kv_requests = ring.shift((k_cur, v_cur))
            kind = _step_kind(step, (rank - step) % size, rank, causal)
            bq, bk, bv, bcausal, cu_q, cu_k, half = _block(kind, layout, q, k_cur, v_cur)
            if half is None:
                bout, bdout, blse = out, dout, lse
            else:
                bout, bdout = layout.take(out, half), layout.take(dout, half)
                blse = layout.take(lse, half).contiguous()
            gq, gk, gv = kernels.backward(bdout, bq, bk, bv, bout, blse, bcausal, scale, cu_q, cu_k)
            if half is None:
                dq.add_(gq)
            else:
                layout.add_to(dq, half, gq.float())
            if kind == "lower":
                layout.add_to(dk, "first", gk.float())
                layout.add_to(dv, "first", gv.float())
            else:
                dk.add_(gk)
                dv.add_(gv)
            if step < size - 1:
                _wait(kv_requests)
                k_cur, v_cur = k_next, v_next
            # The gradients travel with their block, and come home after the last step.
            (dk, dv), grad_requests = ring.shift((dk, dv))
            _wait(grad_requests)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


class LocalAttention(torch.autograd.Function):
    """One kernel call with the same kernels as the ring (CP of one rank, or after Ulysses)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, cu):
        out, lse = kernels.forward(q, k, v, causal, scale, cu, cu)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.cu = causal, scale, cu
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = kernels.backward(dout.contiguous(), q, k, v, out, lse, ctx.causal, ctx.scale, ctx.cu, ctx.cu)
        return dq, dk, dv, None, None, None


# ----------------------------------------------------------------------------- entry
@dataclass(frozen=True)
class CPGroups:
    """The groups one attention call uses: Ulysses inside ``ulysses``, ring across ``ring``."""

    cp_size: int
    ulysses: Optional[object] = None
    ring: Optional[object] = None

    @property
    def ulysses_degree(self) -> int:
        return dist.get_world_size(self.ulysses) if self.ulysses is not None else 1

    @property
    def ring_size(self) -> int:
        return dist.get_world_size(self.ring) if self.ring is not None else 1


def attention(q: Tensor, k: Tensor, v: Tensor, groups: CPGroups, *, causal: bool, scale: float,
              seq_lengths: Optional[Sequence[int]] = None) -> Tensor:
    """Attention over the whole sequence for this CP rank's queries: [b, n, s_local, d] -> [b, n, s_local, dv].

    ``seq_lengths``: the padded lengths of the packed sequences of the stream (b == 1), each a
    multiple of 2 x CP; None for one dense sequence per batch row.
    """
    cp, u = groups.cp_size, groups.ulysses_degree
    s_local = q.size(2)
    lengths = tuple(int(n) for n in seq_lengths) if seq_lengths is not None else (s_local * cp,)
    if u > 1:
        heads = q.size(1)
        if k.size(1) % u:  # too few key/value heads to split: give every query head its own
            k, v = k.repeat_interleave(heads // k.size(1), 1), v.repeat_interleave(heads // v.size(1), 1)
        outer_rank = dist.get_rank(groups.ring) if groups.ring is not None else 0
        perm, inverse = ulysses_order(lengths, cp, u, outer_rank, str(q.device))
        q, k, v = (_AllToAll.apply(x, groups.ulysses, True).index_select(2, perm) for x in (q, k, v))
    ring_size = groups.ring_size
    local_lengths = None if seq_lengths is None else tuple(n // ring_size for n in lengths)
    if ring_size > 1:
        layout = ring_layout(local_lengths, q.size(2), str(q.device))
        out = RingAttention.apply(q, k, v, groups.ring, layout, causal, scale)
    else:
        cu = None if local_lengths is None else _cumulative(local_lengths)
        out = LocalAttention.apply(q, k, v, causal, scale, cu)
    if u > 1:
        out = _AllToAll.apply(out.index_select(2, inverse), groups.ulysses, False)
    return out
