"""What ``torch_npu.npu_fusion_attention`` expects of a mask, shared by the attention layer and
the context-parallel kernels: its sparse modes and the compressed 2048x2048 causal mask.

Modes per the fusion-attention operator's documentation: 0 takes the mask as given, 2 is causal
from the top-left with the compressed mask, 3 is causal within each packed sequence (TND).
"""
from __future__ import annotations

import torch
from torch import Tensor

NPU_CAUSAL_MASK_SIZE = 2048  # npu_fusion_attention's compressed causal mask for sparse_mode 2/3/4
NPU_SPARSE_DEFAULT, NPU_SPARSE_CAUSAL = 0, 2
NPU_SPARSE_VARLEN_CAUSAL = 3  # TND: causal within each packed sequence
NPU_INVALID_ROW_CORRECTION = 2  # inner_precise: fully masked query rows give 0
MAX_TOKENS = 2147483647  # pre_tockens/next_tockens meaning "no band limit"

_masks: dict = {}


def npu_causal_mask(device) -> Tensor:
    """The 2048x2048 bool upper triangle (True = masked) that sparse_mode 2 expects, one per device."""
    key = str(device)
    if key not in _masks:
        n = NPU_CAUSAL_MASK_SIZE
        _masks[key] = torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), diagonal=1)
    return _masks[key]
