"""MoE token permute / unpermute for ``--moe-permute-fusion`` without Transformer Engine.

Same results as megatron's unfused ``moe_utils.permute`` / ``unpermute``, faster: an O(E*T) cumsum +
scatter instead of an argsort, no ``probs.T`` copy, no ``masked_select`` host sync, and on CPU with a
fixed ``k`` experts per token gathers instead of scatter-adds. Our row id map (TE's is its own):
``flat[i] = expert * num_tokens + token`` for permuted row ``i``.

NPU: ``torch_npu.npu_moe_token_permute(tokens, indices[T, k], num_out_tokens, padded_mode=False)`` and
``npu_moe_token_unpermute(permuted, sorted_indices, probs[T, k], padded_mode=False, restore_shape)``,
``indices`` ascending per token (megatron's order). Their contract: a fixed ``k`` per token (the
allgather dispatcher with EP > 1 gives 0 to k, so those calls take the index path, said once);
``sorted_indices`` int32; unpermute without ``probs`` assumes k = 1, so the probability-free merge
passes ones of shape ``[T, k]``; tokens and probs in the promoted dtype, the result in the tokens'.
"""
from __future__ import annotations

import torch


from adaptor import run_state
from adaptor.log import notice_once


def expert_major_order(routing_map: torch.Tensor, num_out_tokens: int) -> torch.Tensor:
    """Equals ``routing_map.T.reshape(-1).argsort(descending=True, stable=True)[:num_out_tokens]``."""
    mask = routing_map.bool().T.reshape(-1)
    n = mask.numel()
    cs = torch.cumsum(mask, 0)
    ar = torch.arange(n, device=mask.device)
    # Selected entries first in order, then the others in order.
    dest = torch.where(mask, cs - 1, cs[-1] + ar - cs)
    order = torch.empty_like(ar).scatter_(0, dest, ar)
    return order[:num_out_tokens]




def _npu_k(routed_per_token: torch.Tensor, num_tokens: int, num_out: int):
    """k when the NPU kernels can route these tokens: every token has exactly k experts."""
    if run_state.backend().name != "npu" or num_tokens == 0 or num_out % num_tokens:
        return None
    k = num_out // num_tokens
    low, high = routed_per_token.aminmax()
    if (int(low), int(high)) == (k, k):
        return k
    notice_once("--moe-permute-fusion: tokens have 0..k of this rank's experts (allgather "
             "dispatcher with EP > 1); npu_moe_token_permute routes a fixed k per token, so these calls "
             "use the index-based permute")
    return None


def _npu_layout(flat: torch.Tensor, num_tokens: int, k: int):
    """(order, indices): the kernels' int32 sorted_indices and each token's experts, ascending."""
    order = torch.argsort(flat % num_tokens, stable=True)
    indices = (flat // num_tokens)[order].view(num_tokens, k)
    return order.to(torch.int32), indices.to(torch.int32)


def _uniform_k_cpu(token: torch.Tensor, num_tokens: int):
    """k when each token has exactly k rows (checked on CPU only, where it costs no sync)."""
    if token.device.type != "cpu" or num_tokens == 0 or token.numel() % num_tokens:
        return None
    k = token.numel() // num_tokens
    return k if bool((torch.bincount(token, minlength=num_tokens) == k).all()) else None


def _sum_rows(x: torch.Tensor, order: torch.Tensor, num_tokens: int, k: int) -> torch.Tensor:
    """out[t] = x[order[t*k]] + ... + x[order[t*k+k-1]], added in that order."""
    cols = order.view(num_tokens, k).t().contiguous()
    out = x.index_select(0, cols[0])
    for j in range(1, k):
        out += x.index_select(0, cols[j])
    return out


class _GatherRows(torch.autograd.Function):
    """x[token]; backward sums each token's rows by gathering, not scatter-adding."""

    @staticmethod
    def forward(ctx, x, token, order, k):
        ctx.save_for_backward(order)
        ctx.k = k
        return x.index_select(0, token)

    @staticmethod
    def backward(ctx, dy):
        (order,) = ctx.saved_tensors
        return _sum_rows(dy.contiguous(), order, order.numel() // ctx.k, ctx.k), None, None, None


class _SumRows(torch.autograd.Function):
    """Each token's rows summed; backward is a gather."""

    @staticmethod
    def forward(ctx, x, token, order, k):
        ctx.save_for_backward(token)
        return _sum_rows(x, order, order.numel() // k, k)

    @staticmethod
    def backward(ctx, dy):
        (token,) = ctx.saved_tensors
        return dy.index_select(0, token), None, None, None


def permute(tokens, routing_map, probs=None, num_out_tokens=None):
    """-> (permuted_tokens, permuted_probs or None, row_id_map)."""
    num_tokens, num_experts = routing_map.shape
    num_out = int(num_out_tokens) if num_out_tokens is not None else num_tokens
    flat = expert_major_order(routing_map, num_out)
    token = flat % num_tokens
    permuted_probs = None
    if probs is not None:
        permuted_probs = probs.reshape(-1).index_select(0, token * num_experts + flat // num_tokens)
    k = _npu_k(routing_map.sum(1), num_tokens, num_out) if run_state.backend().name == "npu" else None
    if k is not None:
        import torch_npu

        _, indices = _npu_layout(flat, num_tokens, k)
        permuted, _ = torch_npu.npu_moe_token_permute(
            tokens, indices, num_out_tokens=num_out, padded_mode=False
        )
        return permuted, permuted_probs, flat
    k = _uniform_k_cpu(token, num_tokens)
    if k is not None:
        order = torch.argsort(token, stable=True)
        return _GatherRows.apply(tokens, token, order, k), permuted_probs, flat
    return tokens.index_select(0, token), permuted_probs, flat


def unpermute(permuted_tokens, row_id_map, restore_shape, probs=None):
    """Sum each token's expert outputs back into place, weighted by ``probs`` [T, E] when given."""
    num_tokens, hidden = restore_shape
    flat = row_id_map
    input_dtype = permuted_tokens.dtype
    token = flat % num_tokens
    if run_state.backend().name == "npu":
        k = _npu_k(torch.bincount(token, minlength=num_tokens), num_tokens, flat.numel())
        if k is not None:
            import torch_npu

            order, indices = _npu_layout(flat, num_tokens, k)
            if probs is None:  # the kernel's own default is k = 1
                probs_k = permuted_tokens.new_ones(num_tokens, k)
            else:  # one dtype for both; as upstream, the product in the promoted dtype, then cast back
                probs_k = probs.gather(1, indices.long())
                permuted_tokens = permuted_tokens.to(torch.promote_types(permuted_tokens.dtype, probs.dtype))
                probs_k = probs_k.to(permuted_tokens.dtype)
            return torch_npu.npu_moe_token_unpermute(
                permuted_tokens, order, probs=probs_k, padded_mode=False, restore_shape=list(restore_shape)
            ).to(input_dtype)
    if probs is not None:
        permuted_probs = probs.reshape(-1).index_select(0, token * probs.shape[1] + flat // num_tokens)
        # As upstream: the product is in the promoted dtype, summed there, then cast back.
        permuted_tokens = permuted_tokens * permuted_probs.unsqueeze(-1)
    k = _uniform_k_cpu(token, num_tokens)
    if k is not None:
        order = torch.argsort(token, stable=True)
        return _SumRows.apply(permuted_tokens, token, order, k).to(dtype=input_dtype)
    out = torch.zeros(restore_shape, dtype=permuted_tokens.dtype, device=permuted_tokens.device)
    if torch.are_deterministic_algorithms_enabled():
        out.index_add_(0, token, permuted_tokens)
    else:
        out.scatter_add_(0, token.unsqueeze(1).expand(-1, hidden), permuted_tokens)
    return out.to(dtype=input_dtype)
