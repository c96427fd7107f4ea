"""What ``grid_thw`` alone decides: patch coordinates, rotary angles, window order, attention segments.

Conventions shared with :mod:`.image_processor`: the patches of one image come merge-block by
merge-block (the ``m x m`` patches one merged token joins are consecutive), images one after another,
each of its ``t`` frames in turn. Nothing here holds weights; everything is a function of the grid.
"""
from __future__ import annotations

import torch


def _grids(grid_thw: torch.Tensor) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in row) for row in grid_thw.tolist()]


def patch_count(grid_thw: torch.Tensor) -> int:
    return sum(t * h * w for t, h, w in _grids(grid_thw))


def check_input(pixel_values: torch.Tensor, grid_thw: torch.Tensor, patch_dim: int, merge: int) -> None:
    """One-line ValueError when the patches and the grid disagree (shape, count, merge blocks)."""
    if grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
        raise ValueError(f"grid_thw must be [images, 3] (t, h, w per image), got shape {list(grid_thw.shape)}")
    bad = [g for g in _grids(grid_thw) if min(g) < 1 or g[1] % merge or g[2] % merge]
    if bad:
        raise ValueError(f"grid_thw row {list(bad[0])} is not positive with h and w multiples of the merge size "
                         f"{merge}")
    if pixel_values.dim() != 2 or pixel_values.shape[1] != patch_dim:
        raise ValueError(f"pixel_values must be [patches, {patch_dim}], got shape {list(pixel_values.shape)}")
    expected = patch_count(grid_thw)
    if pixel_values.shape[0] != expected:
        raise ValueError(f"pixel_values has {pixel_values.shape[0]} patch rows but grid_thw "
                         f"{grid_thw.tolist()} describes {expected}")


def _block_order(h: int, w: int, merge: int) -> torch.Tensor:
    """Raster indices of an h x w grid, listed merge-block by merge-block."""
    raster = torch.arange(h * w).view(h // merge, merge, w // merge, merge)
    return raster.permute(0, 2, 1, 3).reshape(-1)


def patch_coordinates(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """[patches, 2]: each patch's (row, column) in its image, in sequence order."""
    out = []
    for t, h, w in _grids(grid_thw):
        order = _block_order(h, w, merge)
        out.append(torch.stack([order // w, order % w], dim=-1).repeat(t, 1))
    return torch.cat(out)


def rotary_angles(coordinates: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """[patches, head_dim] angles of the 2-D rotary embedding.

    A quarter of the head's rotary pairs turn with the row, a quarter with the column (the same
    frequencies for both axes), and the half-split rotation (first half of the head against the second)
    uses these angles twice over, so the layout is ``[row, col, row, col]`` in quarters.
    """
    axis_dim = head_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float) / axis_dim)
    angles = (coordinates.float()[..., None] * inv_freq).flatten(1)  # [patches, (row freqs, col freqs)]
    return torch.cat([angles, angles], dim=-1)


def frame_lengths(grid_thw: torch.Tensor) -> list[int]:
    """Patches per attention segment of the full-attention blocks: every frame of every image."""
    return [h * w for t, h, w in _grids(grid_thw) for _ in range(t)]


def window_order(grid_thw: torch.Tensor, merge: int, window_merged: int) -> tuple[torch.Tensor, list[int]]:
    """(order, lengths) for windowed attention.

    ``order`` lists merged-token indices (over the whole batch) window by window: each frame's grid of
    merged tokens is cut into ``window_merged`` x ``window_merged`` tiles from the top-left corner (edge
    tiles smaller), tiles in raster order, tokens in a tile in raster order. ``lengths`` gives each
    window's size in patches, the segments of the windowed blocks once the sequence is in that order.
    """
    order, lengths, start = [], [], 0
    for t, h, w in _grids(grid_thw):
        rows, cols = h // merge, w // merge
        for frame in range(t):
            grid = torch.arange(rows * cols).view(rows, cols) + start + frame * rows * cols
            for top in range(0, rows, window_merged):
                for left in range(0, cols, window_merged):
                    tile = grid[top:top + window_merged, left:left + window_merged].reshape(-1)
                    order.append(tile)
                    lengths.append(tile.numel() * merge * merge)
        start += t * rows * cols
    return torch.cat(order), lengths


def reorder_patches(x: torch.Tensor, order: torch.Tensor, merge_unit: int) -> torch.Tensor:
    """Rows of ``x`` [patches, ...] moved by merged token: the ``merge_unit`` patches of each stay together."""
    rest = x.shape[1:]
    return x.reshape(-1, merge_unit, *rest)[order].reshape(-1, *rest)


def segment_mask(lengths: list[int], device=None) -> torch.Tensor:
    """[1, 1, n, n] boolean, True where attention is blocked: each segment sees only itself.

    megatron-core's attention fills True entries before the softmax, so a block-diagonal mask gives
    variable-length attention over the packed sequence of all images (or windows) in one call.
    """
    ids = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    return (ids[:, None] != ids[None, :])[None, None]


def interpolation_taps(grid_thw: torch.Tensor, side: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([patches, 4] table indices, [patches, 4] weights): a ``side x side`` learned position table
    resampled bilinearly to each image's h x w grid, corners aligned (the first and last patch take the
    table's first and last rows), in sequence order."""
    indices, weights = [], []
    for t, h, w in _grids(grid_thw):
        def axis(n: int):
            source = torch.arange(n, dtype=torch.float32) * (side - 1) / max(n - 1, 1)
            low = source.floor()
            frac = source - low
            low = low.long()
            return low, (low + 1).clamp(max=side - 1), frac

        r0, r1, fr = axis(h)
        c0, c1, fc = axis(w)
        corners = [(r0, c0, (1 - fr)[:, None] * (1 - fc)[None]), (r0, c1, (1 - fr)[:, None] * fc[None]),
                   (r1, c0, fr[:, None] * (1 - fc)[None]), (r1, c1, fr[:, None] * fc[None])]
        idx = torch.stack([(r[:, None] * side + c[None]).reshape(-1) for r, c, _ in corners], dim=-1)
        wgt = torch.stack([wt.reshape(-1) for _, _, wt in corners], dim=-1)
        order = _block_order(h, w, merge)
        indices.append(idx[order].repeat(t, 1))
        weights.append(wgt[order].repeat(t, 1))
    return torch.cat(indices), torch.cat(weights)
