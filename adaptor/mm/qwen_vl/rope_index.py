"""Qwen2.5-VL's and Qwen3-VL's 3-D rotary positions (temporal, height, width) for every token.

The rule, as transformers' ``get_rope_index`` of both models applies it (5.x):

* Positions count only the tokens the attention mask keeps; padding gets 0 on all three axes.
* A text token has the same position ``p`` on the three axes, and the next token starts at ``p + 1``.
* An image or video occupies ``t * h * w`` placeholder tokens (its ``grid_thw`` with height and width
  divided by the spatial merge size), laid out frame by frame, row by row. Token ``(i, j, k)`` of an item
  starting at ``p`` gets ``(p + floor(i * interval), p + j, p + k)``; the token after the item starts at
  ``p + max(h, w)``. The interval is 1 for images; for a Qwen2.5-VL video it is
  ``tokens_per_second * second_per_grid_ts`` of that video.
* Qwen3-VL separates a video's frames with timestamp text, so each frame is an item of its own
  (``t`` items of one frame), and the temporal interval does not apply.
* ``deltas[b]`` = the largest position of sample ``b`` + 1 - its token count: generation continues a
  sample at position ``token index + delta`` on the three axes (:func:`generation_positions`).

Items are matched to placeholder tokens in order over the batch, images and videos separately. Unlike
transformers, two items may follow each other without text between them; every item's tokens must still
form one run of one sample, and the counts must agree: a mismatch raises ``ValueError`` in one line.
"""
from __future__ import annotations

import torch

TEXT, IMAGE, VIDEO = 0, 1, 2
_KIND_NAMES = {IMAGE: "image", VIDEO: "video"}


def token_types(input_ids: torch.Tensor, image_token_id: int, video_token_id: int | None = None) -> torch.Tensor:
    """TEXT, IMAGE or VIDEO per token (transformers' ``mm_token_type_ids``) from the placeholder ids."""
    types = torch.full_like(input_ids, TEXT, dtype=torch.long)
    types[input_ids == image_token_id] = IMAGE
    if video_token_id is not None:
        types[input_ids == video_token_id] = VIDEO
    return types


def _merged_grids(grid_thw, merge: int, what: str) -> torch.Tensor:
    grid = torch.as_tensor(grid_thw, dtype=torch.long).reshape(-1, 3)
    if (grid[:, 1:] % merge).any() or (grid <= 0).any():
        raise ValueError(f"{what}_grid_thw {grid.tolist()}: heights and widths must be positive multiples of "
                         f"the spatial merge size {merge}")
    return torch.stack([grid[:, 0], grid[:, 1] // merge, grid[:, 2] // merge], dim=-1)


def _place_items(kind_of_token, sample_of_token, kind, grid, interval, offsets, advance):
    """Fill ``offsets`` (3, n) and ``advance`` (n) for the tokens of one kind; both indexed in compact order."""
    tokens = (kind_of_token == kind).nonzero().squeeze(1)
    length = grid.prod(-1)
    name = _KIND_NAMES[kind]
    if tokens.numel() != int(length.sum()):
        raise ValueError(f"{tokens.numel()} {name} placeholder tokens but the {len(grid)} {name} grids given "
                         f"hold {int(length.sum())}")
    if tokens.numel() == 0:
        return
    ends = length.cumsum(0)
    starts = ends - length
    first, last = tokens[starts], tokens[ends - 1]
    split = (sample_of_token[first] != sample_of_token[last]) | (last - first + 1 != length)
    if split.any():
        item = int(split.nonzero()[0])
        raise ValueError(f"{name} {item}'s {int(length[item])} placeholder tokens are not one run of one sample")
    index = torch.arange(tokens.numel(), device=tokens.device)
    item = torch.searchsorted(ends, index, right=True)
    within = index - starts[item]
    _, h, w = grid[item].unbind(-1)
    frame = within // (h * w)
    offsets[0, tokens] = (frame * interval[item]).long()  # floor of the scaled frame index, as transformers
    offsets[1, tokens] = (within // w) % h
    offsets[2, tokens] = within % w
    advance[last] = torch.maximum(grid[:, 1], grid[:, 2])


def _rope_index(types, attention_mask, items):
    """Positions (3, B, S) and deltas (B, 1) from token kinds and {kind: (merged grids, temporal intervals)}."""
    batch, seq = types.shape
    device = types.device
    keep = torch.ones_like(types, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    sample_of_token = torch.arange(batch, device=device)[:, None].expand(batch, seq)[keep]  # batch-major
    kind_of_token = types[keep]
    n = kind_of_token.numel()
    offsets = torch.zeros(3, n, dtype=torch.long, device=device)
    advance = (kind_of_token == TEXT).long()  # a text token moves the next one on by 1, an item by max(h, w)
    unknown = ~torch.isin(kind_of_token, torch.tensor([TEXT, IMAGE, VIDEO], device=device))
    if unknown.any():
        raise ValueError(f"token type {int(kind_of_token[unknown][0])} is none of text (0), image (1), video (2)")
    for kind in (IMAGE, VIDEO):
        grid, interval = items[kind]
        _place_items(kind_of_token, sample_of_token, kind, grid.to(device), interval.to(device), offsets, advance)
    # Each token's start: the advances before it in its own sample (an item's tokens share their item's).
    before = advance.cumsum(0) - advance
    counts = keep.sum(1)
    sample_begin = counts.cumsum(0) - counts
    if n:
        before = before - before[sample_begin.clamp(max=n - 1)][sample_of_token]
    positions = before[None, :] + offsets
    out = torch.zeros(3, batch, seq, dtype=torch.long, device=device)
    out[:, keep] = positions
    largest = torch.full((batch,), -1, dtype=torch.long, device=device)
    largest = largest.scatter_reduce(0, sample_of_token, positions.amax(0), "amax", include_self=True)
    return out, (largest + 1 - counts)[:, None]


def _no_items():
    return torch.zeros(0, 3, dtype=torch.long), torch.zeros(0)


def _items_with_images(image_grid_thw, merge: int) -> dict:
    """Each image an item of interval 1; no videos yet (the families place those differently)."""
    items = {IMAGE: _no_items(), VIDEO: _no_items()}
    if image_grid_thw is not None:
        grid = _merged_grids(image_grid_thw, merge, "image")
        items[IMAGE] = grid, torch.ones(len(grid), dtype=torch.long)
    return items


def qwen2_5_vl_rope_index(types: torch.Tensor, image_grid_thw=None, video_grid_thw=None, second_per_grid_ts=None,
                          attention_mask: torch.Tensor | None = None, *, spatial_merge_size: int = 2,
                          tokens_per_second: float = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5-VL's (position_ids (3, B, S), deltas (B, 1)) for ``types`` (B, S) of :func:`token_types`.

    A video's frames are ``tokens_per_second * second_per_grid_ts[v]`` positions apart on the temporal
    axis (``second_per_grid_ts`` of None: 1 s per grid).
    """
    items = _items_with_images(image_grid_thw, spatial_merge_size)
    if video_grid_thw is not None:
        grid = _merged_grids(video_grid_thw, spatial_merge_size, "video")
        seconds = torch.ones(len(grid)) if second_per_grid_ts is None else torch.as_tensor(second_per_grid_ts)
        if seconds.numel() != len(grid):
            raise ValueError(f"{seconds.numel()} second_per_grid_ts values for {len(grid)} videos")
        items[VIDEO] = grid, seconds.reshape(-1) * tokens_per_second
    return _rope_index(types, attention_mask, items)


def qwen3_vl_rope_index(types: torch.Tensor, image_grid_thw=None, video_grid_thw=None,
                        attention_mask: torch.Tensor | None = None, *, spatial_merge_size: int = 2
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-VL's (position_ids (3, B, S), deltas (B, 1)): each video frame is an item of one frame."""
    items = _items_with_images(image_grid_thw, spatial_merge_size)
    if video_grid_thw is not None:
        grid = _merged_grids(video_grid_thw, spatial_merge_size, "video")
        frames = grid.repeat_interleave(grid[:, 0], dim=0)
        frames[:, 0] = 1
        items[VIDEO] = frames, torch.ones(len(frames), dtype=torch.long)
    return _rope_index(types, attention_mask, items)


def generation_positions(deltas: torch.Tensor, start: int, length: int = 1) -> torch.Tensor:
    """Positions (3, B, length) of tokens ``start .. start + length - 1`` generated after a prompt whose
    :func:`qwen2_5_vl_rope_index` / :func:`qwen3_vl_rope_index` gave ``deltas`` (B, 1): text positions
    moved by each sample's delta, equal on the three axes."""
    steps = torch.arange(start, start + length, device=deltas.device)
    return (steps[None, :] + deltas.reshape(-1, 1))[None].expand(3, -1, -1)
