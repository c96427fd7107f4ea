"""STAND-IN torch_npu fused operators (moe): check each call's arguments, return CPU reference results.

Conventions checked (torch_npu docs): npu_grouped_matmul takes lists; with
one x and one y (split_item 2/3) group_list is a 1-D int64 tensor, cumulative
for group_list_type=0; group_type=0 splits x's rows (M), group_type=2 splits
the K axis (x^T's columns) and returns one [E, K_in, N] tensor per group.
npu_moe_token_permute: indices [T, topk] int; sorted_indices[t*topk+j] is the
output row of token t's j-th expert; unpermute takes those and probs [T, topk].
"""
from __future__ import annotations

import torch

__all__ = ["npu_grouped_matmul", "npu_moe_token_permute", "npu_moe_token_unpermute"]


def _record(name, args, kwargs):
    from torch_npu import calls

    calls.append((name, args, kwargs))


def _check_group_list(group_list, n_groups, total, group_list_type):
    assert torch.is_tensor(group_list) and group_list.dtype == torch.int64 and group_list.dim() == 1, group_list
    assert group_list.numel() == n_groups, (group_list.numel(), n_groups)
    assert group_list_type == 0, "the adaptor passes cumulative group lists"
    assert bool((group_list[1:] >= group_list[:-1]).all()) and int(group_list[-1]) == total, (group_list, total)
    return [0] + group_list.tolist()


def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                       activation_quant_scale=None, activation_quant_offset=None, split_item=0, group_type=-1,
                       group_list_type=0, act_type=0, output_dtype=None):
    _record("npu_grouped_matmul", (x, weight), dict(bias=bias, group_list=group_list, split_item=split_item,
                                                    group_type=group_type, group_list_type=group_list_type))
    assert isinstance(x, list) and isinstance(weight, list) and len(x) == 1, "one x tensor, a weight list"
    assert bias is None and scale is None and act_type == 0 and output_dtype is None
    assert split_item in (2, 3), "one output tensor"
    (a,) = x
    assert a.dim() == 2 and all(w.dim() == 2 for w in weight)
    if group_type == 0:
        off = _check_group_list(group_list, len(weight), a.shape[0], group_list_type)
        for w in weight:
            assert w.shape[0] == a.shape[1] and w.shape == weight[0].shape, (a.shape, w.shape)
        out = a.new_zeros(a.shape[0], weight[0].shape[1])
        for e, w in enumerate(weight):
            out[off[e]:off[e + 1]] = a[off[e]:off[e + 1]] @ w
        return [out]
    assert group_type == 2 and len(weight) == 1, "K-split: one x^T, one dy"
    (b,) = weight
    assert a.shape[1] == b.shape[0], (a.shape, b.shape)
    n_groups = group_list.numel()
    off = _check_group_list(group_list, n_groups, a.shape[1], group_list_type)
    return [torch.stack([a[:, off[e]:off[e + 1]] @ b[off[e]:off[e + 1]] for e in range(n_groups)])]


def npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    _record("npu_moe_token_permute", (tokens, indices), dict(num_out_tokens=num_out_tokens, padded_mode=padded_mode))
    assert padded_mode is False
    assert tokens.dim() == 2 and indices.dim() == 2 and indices.shape[0] == tokens.shape[0]
    assert indices.dtype in (torch.int32, torch.int64)
    topk = indices.shape[1]
    flat = indices.reshape(-1)
    n = flat.numel() if not num_out_tokens else num_out_tokens
    first = torch.argsort(flat, stable=True)
    sorted_indices = torch.argsort(first, stable=True)
    out = tokens.index_select(0, first // topk)[:n]
    return out, sorted_indices


def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    _record("npu_moe_token_unpermute", (permuted_tokens, sorted_indices),
            dict(probs=probs, padded_mode=padded_mode, restore_shape=restore_shape))
    assert padded_mode is False and sorted_indices.dim() == 1
    assert sorted_indices.numel() == permuted_tokens.shape[0]
    num_tokens = restore_shape[0] if restore_shape is not None else None
    if probs is not None:
        assert probs.dim() == 2 and probs.numel() == sorted_indices.numel()
        num_tokens = probs.shape[0]
    topk = sorted_indices.numel() // num_tokens
    rows = permuted_tokens.index_select(0, sorted_indices).view(num_tokens, topk, -1)
    if probs is not None:
        rows = rows * probs.unsqueeze(-1)
    return rows.sum(1).to(permuted_tokens.dtype)
