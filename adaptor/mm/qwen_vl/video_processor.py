"""Video frames to the vision tower's input: ``pixel_values_videos [patches, C*T*P*P]`` and a ``(t, h, w)`` grid.

A video is its frames in order (read by :mod:`.video_frames`). Each frame is sized and normalised as an
image is (:mod:`.image_processor`: one size for the whole video, from the first frame, within the video's
pixel bounds); then consecutive frames are grouped ``temporal_patch_size`` at a time, the last frame
repeated until the count is a multiple of it, so the tower's 3-D patch embedding sees real motion where
an image sees the same frame twice. Patches are laid out group by group, merge block by merge block, each
row ``C, T, P, P`` — the layout of transformers' Qwen2-VL video processor.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from adaptor.mm.qwen_vl.image_processor import ImageSettings, _normalised, target_size

# The published Qwen2.5-VL video processor's pixel bounds per frame (the image ones are wider).
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28


def video_settings(image: ImageSettings, min_pixels: int | None, max_pixels: int | None) -> ImageSettings:
    """The image processor's numbers with a video's pixel bounds (data.json's ``video_min_pixels`` /
    ``video_max_pixels``, else the published video processor's)."""
    low = VIDEO_MIN_PIXELS if min_pixels is None else min_pixels
    high = VIDEO_MAX_PIXELS if max_pixels is None else max_pixels
    if not 0 <= low <= high or high <= 0:
        raise ValueError(f"video_min_pixels {low} and video_max_pixels {high} must satisfy 0 <= min <= max, max > 0")
    return dataclasses.replace(image, min_pixels=low, max_pixels=high)


def preprocess_video(frames, settings: ImageSettings) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """PIL frames (or HxWx3 uint8 arrays) of one video -> (pixel_values float32 [patches, C*T*P*P], (t, h, w))."""
    if not frames:
        raise ValueError("a video without frames")
    sizes = {(f.shape[0], f.shape[1]) if isinstance(f, np.ndarray) else (f.height, f.width) for f in frames}
    if len(sizes) > 1:
        raise ValueError(f"a video's frames differ in size ({', '.join(f'{h}x{w}' for h, w in sorted(sizes))})")
    height, width = target_size(*sizes.pop(), settings)
    fixed = dataclasses.replace(settings, min_pixels=height * width, max_pixels=height * width)
    stacked = np.stack([_normalised(frame, fixed) for frame in frames])  # [F, C, H, W], all one size
    p, m, t = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    missing = -len(frames) % t
    if missing:
        stacked = np.concatenate([stacked, np.repeat(stacked[-1:], missing, axis=0)])
    count, c = stacked.shape[:2]
    gt, gh, gw = count // t, height // p, width // p
    grouped = stacked.reshape(gt, t, c, gh // m, m, p, gw // m, m, p)
    # [group, T, C, block row, row in block, P, block col, col in block, P] -> rows of C, T, P, P
    rows = grouped.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gt * gh * gw, c * t * p * p)
    return torch.from_numpy(np.ascontiguousarray(rows)), (gt, gh, gw)
