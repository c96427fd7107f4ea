"""Token ids and vision embeddings in, logits out, through the decoder of :mod:`adaptor.mm.qwen_vl.decoder`.

The decoder's input is the token embedding with each image (video) placeholder token's row replaced by
the next row of the image (video) embeddings the vision tower gave, in batch-major token order; its
positions are :mod:`adaptor.mm.qwen_vl.rope_index`'; Qwen3-VL's deepstack features go in through
:func:`adaptor.mm.qwen_vl.deepstack.deepstack_features`.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from adaptor.mm.qwen_vl.deepstack import deepstack_features
from adaptor.mm.qwen_vl.rope_index import (
    IMAGE, VIDEO, qwen2_5_vl_rope_index, qwen3_vl_rope_index, token_types,
)
from adaptor.mm.qwen_vl.text_config import VlTextConfig


def replace_placeholders(embeddings: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, what: str) -> torch.Tensor:
    """``embeddings`` [s, b, h] with the tokens of ``mask`` (b, s) given ``rows`` in batch-major order."""
    batch_index, seq_index = mask.nonzero(as_tuple=True)
    if rows.shape[0] != batch_index.numel():
        raise ValueError(f"{batch_index.numel()} {what} placeholder tokens but {rows.shape[0]} {what} embeddings")
    return embeddings.index_put((seq_index, batch_index), rows.to(embeddings.dtype))


def padded_causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Megatron's attention mask [b, 1, s, s] (True: not attended) of a causal decoder over ``attention_mask``
    (b, s), 1 where a token is kept, 0 where it pads."""
    seq = attention_mask.shape[1]
    future = torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device).triu(1)
    return future[None, None] | ~attention_mask.bool()[:, None, None, :]


def multimodal_positions(text: VlTextConfig, types, image_grid_thw=None, video_grid_thw=None, *,
                         attention_mask=None, second_per_grid_ts=None, spatial_merge_size: int = 2,
                         tokens_per_second: float = 2):
    """(position_ids (3, b, s), deltas (b, 1)) by the rule of ``text.family``."""
    if text.family == "qwen3_vl":
        return qwen3_vl_rope_index(types, image_grid_thw, video_grid_thw, attention_mask,
                                   spatial_merge_size=spatial_merge_size)
    return qwen2_5_vl_rope_index(types, image_grid_thw, video_grid_thw, second_per_grid_ts, attention_mask,
                                 spatial_merge_size=spatial_merge_size, tokens_per_second=tokens_per_second)


def vl_logits(model, text: VlTextConfig, input_ids: torch.Tensor, *, image_token_id: int,
              image_embeds: torch.Tensor | None = None, image_grid_thw=None, video_token_id: int | None = None,
              video_embeds: torch.Tensor | None = None, video_grid_thw=None, second_per_grid_ts=None,
              attention_mask: torch.Tensor | None = None, deepstack_embeds=None, spatial_merge_size: int = 2,
              tokens_per_second: float = 2) -> torch.Tensor:
    """Logits [b, s, vocab] of ``model`` (:func:`~adaptor.mm.qwen_vl.decoder.build_decoder`, one stage
    holding embedding and output layer) for a batch of ``input_ids`` (b, s) with images and videos.

    ``image_embeds``: the vision tower's rows, all images in order; ``deepstack_embeds``: per layer, rows for
    the image and video tokens together in batch-major order. ``attention_mask`` (b, s): 0 at padding.
    The embeddings are replaced over the whole sequence, so sequence parallelism is refused.
    """
    if model.config.sequence_parallel or model.config.context_parallel_size > 1:
        raise ValueError("vl_logits places vision rows in the whole sequence: no sequence or context parallelism")
    types = token_types(input_ids, image_token_id, video_token_id)
    position_ids, _ = multimodal_positions(
        text, types, image_grid_thw, video_grid_thw, attention_mask=attention_mask,
        second_per_grid_ts=second_per_grid_ts, spatial_merge_size=spatial_merge_size,
        tokens_per_second=tokens_per_second)
    embeddings = model.embedding(input_ids=input_ids, position_ids=None)
    for kind, rows, what in ((IMAGE, image_embeds, "image"), (VIDEO, video_embeds, "video")):
        mask = types == kind
        if rows is not None or mask.any():
            embeddings = replace_placeholders(embeddings, mask, rows if rows is not None else embeddings[:0, 0],
                                              what)
    mask = None if attention_mask is None else padded_causal_mask(attention_mask)
    stack = nullcontext()
    if deepstack_embeds is not None:
        stack = deepstack_features(model, (types == IMAGE) | (types == VIDEO), deepstack_embeds)
    with stack:
        return model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, decoder_input=embeddings)
