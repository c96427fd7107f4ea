"""Grouped matmul for MoE experts, and the experts module that uses it.

``grouped_matmul(x, weights, counts)``: group ``e`` (``counts[e]`` rows of ``x``, in order) times
``weights[e].t()`` (Linear layout ``[out, in]``), one call for all local experts:

* NPU: ``torch_npu.npu_grouped_matmul`` (split_item=2, group_type=0, cumulative int64 group_list;
  weight grads group_type=2). fp16/bf16 only for grouped tensors, so fp32 experts take the loop
  (said once).
* CUDA: ``torch._grouped_mm`` (bf16, sm90+, 16-byte aligned rows), else the loop.
* CPU: one autograd node looping ``torch.mm`` over row blocks into one output.

``GroupedExperts`` replaces megatron's ``SequentialMLP`` for ``--moe-grouped-gemm`` (a spec swap).
It subclasses it and keeps its parameters, so checkpoints are the same with and without the flag;
only ``forward`` changes, reusing megatron's ``MLP.forward`` activation code.
"""
from __future__ import annotations

import torch

from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.moe.experts import SequentialMLP

from adaptor import run_state
from adaptor.log import notice_once


def _offsets(counts: list[int]) -> list[int]:
    out, s = [0], 0
    for c in counts:
        s += c
        out.append(s)
    return out


class _LoopGroupedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, counts, *weights):
        off = _offsets(counts)
        out = x.new_empty(x.shape[0], weights[0].shape[0])
        for e, w in enumerate(weights):
            if counts[e]:
                torch.mm(x[off[e]:off[e + 1]], w.t(), out=out[off[e]:off[e + 1]])
        ctx.counts = counts
        ctx.save_for_backward(x, *weights)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, *weights = ctx.saved_tensors
        off = _offsets(ctx.counts)
        dy = dy.contiguous()
        dx = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        dws = []
        for e, w in enumerate(weights):
            a, b = off[e], off[e + 1]
            if dx is not None and b > a:
                torch.mm(dy[a:b], w, out=dx[a:b])
            dws.append(dy[a:b].t() @ x[a:b] if ctx.needs_input_grad[2 + e] else None)
        return (dx, None, *dws)


class _NpuGroupedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group_list, *weights):
        import torch_npu

        out = torch_npu.npu_grouped_matmul(
            [x], [w.t() for w in weights], group_list=group_list,
            split_item=2, group_type=0, group_list_type=0,
        )[0]
        ctx.group_list = group_list
        ctx.save_for_backward(x, *weights)
        return out

    @staticmethod
    def backward(ctx, dy):
        import torch_npu

        x, *weights = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch_npu.npu_grouped_matmul(
            [dy], list(weights), group_list=ctx.group_list,
            split_item=2, group_type=0, group_list_type=0,
        )[0]
        # [E, in, out]: x_e^T @ dy_e, groups along the token (K) axis.
        dw = torch_npu.npu_grouped_matmul(
            [x.t()], [dy], group_list=ctx.group_list,
            split_item=3, group_type=2, group_list_type=0,
        )[0]
        return (dx, None, *[dw[e].t() for e in range(len(weights))])


def _cuda_grouped_mm_ok(x: torch.Tensor, weights) -> bool:
    if not (hasattr(torch, "_grouped_mm") and x.is_cuda and x.dtype == torch.bfloat16):
        return False
    if torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    return x.shape[1] % 8 == 0 and weights[0].shape[0] % 8 == 0


def grouped_matmul(x: torch.Tensor, weights, counts) -> torch.Tensor:
    """``cat_e(x_e @ weights[e].t())`` for row groups of sizes ``counts``."""
    weights = list(weights)
    if len(weights) == 1:
        return x @ weights[0].t()
    backend = run_state.backend().name
    if backend == "npu" and x.dtype == torch.float32:
        notice_once("--moe-grouped-gemm on NPU: npu_grouped_matmul takes float32 only as single x/weight/y "
                  "tensors, not one weight per expert; fp32 experts run one matmul each (use --bf16 for the "
                  "grouped kernel)")
    elif backend == "npu":
        counts_t = counts if torch.is_tensor(counts) else torch.tensor(counts)
        group_list = torch.cumsum(counts_t.to(torch.int64), 0).to(x.device)
        return _NpuGroupedMatmul.apply(x, group_list, *weights)
    if backend == "cuda" and _cuda_grouped_mm_ok(x, weights):
        counts_t = counts if torch.is_tensor(counts) else torch.tensor(counts)
        offs = torch.cumsum(counts_t.to(x.device), 0).to(torch.int32)
        return torch._grouped_mm(x, torch.stack(weights).transpose(1, 2), offs=offs)
    counts = counts.tolist() if torch.is_tensor(counts) else [int(c) for c in counts]
    return _LoopGroupedMatmul.apply(x, counts, *weights)


class _Linear(torch.nn.Module):
    """Stands for an expert linear inside megatron's MLP.forward: grouped, bias kept apart."""

    def __init__(self):
        super().__init__()
        self.fn = None

    def forward(self, x):
        return self.fn(x)


class _MlpProxy(torch.nn.Module):
    """What MLP.forward reads from ``self``: config, activation_func, linear_fc1, linear_fc2."""

    def __init__(self, config, activation_func):
        super().__init__()
        self.config = config
        self.activation_func = activation_func
        self.linear_fc1 = _Linear()
        self.linear_fc2 = _Linear()


class GroupedExperts(SequentialMLP):
    """SequentialMLP's parameters, one grouped matmul per linear for all local experts."""

    def __init__(self, num_local_experts, config, submodules, pg_collection=None, name=None):
        super().__init__(num_local_experts, config, submodules, pg_collection=pg_collection, name=name)
        cfg = self.config
        if cfg.fp8 or getattr(cfg, "fp4", None):
            raise ValueError("--moe-grouped-gemm on the local spec does not support fp8/fp4")
        if cfg.use_te_activation_func:
            raise ValueError("--moe-grouped-gemm on the local spec does not support TE activations")
        e0 = self.local_experts[0]
        for lin in (e0.linear_fc1, e0.linear_fc2):
            tp = lin.tp_group.size() if lin.tp_group is not None else 1
            if not hasattr(lin, "weight") or (tp > 1 and not lin.explicit_expert_comm):
                raise ValueError("--moe-grouped-gemm: expert linears must be plain local matmuls")
        # Not registered as a submodule: it holds no parameters.
        object.__setattr__(self, "_proxy", _MlpProxy(cfg, e0.activation_func))

    def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
        if self.config.moe_apply_probs_on_input or self.num_local_experts == 1:
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        counts = tokens_per_expert.tolist() if torch.is_tensor(tokens_per_expert) else list(tokens_per_expert)
        experts = self.local_experts
        w1 = [e.linear_fc1.weight for e in experts]
        w2 = [e.linear_fc2.weight for e in experts]
        rows = None
        if experts[0].linear_fc1.bias is not None or experts[0].linear_fc2.bias is not None:
            rows = torch.repeat_interleave(
                torch.arange(len(counts), device=permuted_local_hidden_states.device),
                torch.tensor(counts, device=permuted_local_hidden_states.device),
            )

        def fc1(x):
            b = experts[0].linear_fc1.bias
            bias = torch.stack([e.linear_fc1.bias for e in experts])[rows] if b is not None else None
            return grouped_matmul(x, w1, counts), bias

        def fc2(x):
            return grouped_matmul(x, w2, counts), None

        proxy = self._proxy
        proxy.linear_fc1.fn, proxy.linear_fc2.fn = fc1, fc2
        try:
            output, _ = MLP.forward(proxy, permuted_local_hidden_states, permuted_probs)
        finally:
            proxy.linear_fc1.fn = proxy.linear_fc2.fn = None
        if experts[0].linear_fc2.bias is not None:
            b2 = torch.stack([e.linear_fc2.bias for e in experts])[rows]
            output = output + b2 * permuted_probs.unsqueeze(-1)
        return output, None
