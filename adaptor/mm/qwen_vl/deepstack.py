"""Qwen3-VL's deepstack: visual features added to the visual tokens' hidden states after early layers.

The Qwen3-VL vision tower also returns features from some of its inner blocks
(``deepstack_visual_indexes``); the text decoder adds the ``i``-th of them to the output of its layer
``i``, at the image and video placeholder tokens only. :func:`deepstack_features` does that to a
``GPTModel`` with forward hooks on its decoder layers for the length of a ``with`` block, so the layers
stay megatron-core's. Layers are counted globally (``layer_number - 1``), so a pipeline stage adds
only the features of the layers it holds. The hidden states must hold the whole sequence (no sequence
or context parallel split).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch


def _add_at_visual_tokens(seq_batch, batch_index, seq_index, features, module, args, output):
    hidden = output[0] if isinstance(output, tuple) else output
    if tuple(hidden.shape[:2]) != seq_batch:
        raise ValueError(f"deepstack: hidden states of {tuple(hidden.shape[:2])} (seq, batch) for a visual mask of "
                         f"{seq_batch}; a sequence split is not supported")
    hidden = hidden.index_put((seq_index, batch_index), features.to(hidden.dtype), accumulate=True)
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


@contextmanager
def deepstack_features(model, visual_mask: torch.Tensor, layer_features):
    """Within the block, layer ``i`` of ``model`` (a ``GPTModel``) adds ``layer_features[i]`` (rows: the
    visual tokens of ``visual_mask`` (batch, seq) in batch-major order) to its output at those tokens."""
    batch_index, seq_index = visual_mask.nonzero(as_tuple=True)
    count = batch_index.numel()
    for i, features in enumerate(layer_features):
        if features.shape[0] != count:
            raise ValueError(f"deepstack features of layer {i} have {features.shape[0]} rows for {count} "
                             f"visual tokens")
    handles = []
    try:
        for layer in model.decoder.layers:
            index = layer.layer_number - 1
            if index < len(layer_features):
                hook = partial(_add_at_visual_tokens, tuple(visual_mask.shape[::-1]), batch_index, seq_index,
                               layer_features[index])
                handles.append(layer.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()
