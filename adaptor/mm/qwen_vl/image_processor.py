"""Images to the vision towers' input: ``pixel_values [patches, C*T*P*P]`` and ``grid_thw [images, 3]``.

Qwen2.5-VL and Qwen3-VL read images the same way and differ only in numbers (patch 14 and CLIP's
mean/std, or patch 16 and mean/std 0.5), so one function takes a :class:`ImageSettings`:

1. the size: both sides a multiple of ``patch_size * merge_size`` (so merging 2x2 patches later never
   leaves a remainder), the area kept inside ``[min_pixels, max_pixels]`` (MindSpeed-MM's
   ``image_min_pixels`` / ``image_max_pixels``), the aspect ratio kept as far as rounding allows;
2. Pillow's bicubic resize of the RGB image (transparency over white), so that the bytes equal those of
   the reference processor;
3. scale to [0, 1] and normalise per channel, in float32;
4. the still image repeated ``temporal_patch_size`` times (the patch embedding is a 3-D convolution
   made for video), and patches laid out merge-block by merge-block: the 2x2 patches that the merger
   later joins into one token are neighbours in the sequence.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class ImageSettings:
    """What the processor needs; the defaults of the published Qwen2.5-VL processor."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    mean: tuple = CLIP_MEAN
    std: tuple = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


QWEN2_5_VL = ImageSettings()
# Qwen3-VL's published preprocessor_config.json: 16-pixel patches, mean and std 0.5, larger bounds.
QWEN3_VL = ImageSettings(patch_size=16, min_pixels=65536, max_pixels=16777216, mean=(0.5,) * 3, std=(0.5,) * 3)


def image_settings(family: str, min_pixels: int | None = None, max_pixels: int | None = None) -> ImageSettings:
    """A family's processor numbers, with data.json's ``image_min_pixels`` / ``image_max_pixels`` when given."""
    presets = {"qwen2_5_vl": QWEN2_5_VL, "qwen3_vl": QWEN3_VL}
    if family not in presets:
        raise ValueError(f"no image processor for {family!r} (known: {', '.join(presets)})")
    base = presets[family]
    low = base.min_pixels if min_pixels is None else min_pixels
    high = base.max_pixels if max_pixels is None else max_pixels
    if not 0 <= low <= high or high <= 0:  # MindSpeed-MM's examples give image_min_pixels 0 (no lower bound)
        raise ValueError(f"image_min_pixels {low} and image_max_pixels {high} must satisfy 0 <= min <= max, max > 0")
    return dataclasses.replace(base, min_pixels=low, max_pixels=high)


def target_size(height: int, width: int, settings: ImageSettings) -> tuple[int, int]:
    """(height, width) to resize to: multiples of the factor, area within the bounds, ratio kept."""
    factor, low, high = settings.factor, settings.min_pixels, settings.max_pixels
    if min(height, width) < 1:
        raise ValueError(f"an image of {height}x{width} pixels has no area")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"an image of {height}x{width} pixels is more than {MAX_ASPECT_RATIO} times as long as "
                         f"it is wide")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > high:  # shrink by the area ratio, rounding down so that it stays under the bound
        shrink = math.sqrt(height * width / high)
        h = max(factor, math.floor(height / shrink / factor) * factor)
        w = max(factor, math.floor(width / shrink / factor) * factor)
    elif h * w < low:  # grow, rounding up so that it reaches the bound
        grow = math.sqrt(low / (height * width))
        h = math.ceil(height * grow / factor) * factor
        w = math.ceil(width * grow / factor) * factor
    if h == 0 or w == 0:  # only without a lower bound: a side under half a factor rounds to nothing
        raise ValueError(f"an image of {height}x{width} pixels is too small for {factor}-pixel blocks "
                         f"(raise image_min_pixels)")
    return h, w


def _rgb(image):
    """RGB of any Pillow mode; transparent pixels are laid over white (as the reference does), not black."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        over_white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(over_white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def _normalised(image, settings: ImageSettings) -> np.ndarray:
    """The resized image as float32 [C, H, W], scaled to [0, 1] and normalised."""
    from PIL import Image

    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    image = _rgb(image)
    h, w = target_size(image.height, image.width, settings)
    pixels = np.asarray(image.resize((w, h), resample=Image.Resampling.BICUBIC)).transpose(2, 0, 1)
    # Scale in float64 and round once to float32, then normalise in float32: the reference's rounding.
    scaled = (pixels.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(settings.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(settings.std, dtype=np.float32)[:, None, None]
    return (scaled - mean) / std


def patchify(image: np.ndarray, settings: ImageSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """[C, H, W] -> ([patches, C*T*P*P] in merge-block order, (1, H/P, W/P))."""
    c, height, width = image.shape
    p, m, t = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    gh, gw = height // p, width // p
    if gh * p != height or gw * p != width or gh % m or gw % m:
        raise ValueError(f"an image of {height}x{width} pixels does not split into {m}x{m} blocks of "
                         f"{p}-pixel patches")
    blocks = image.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    # [block row, block col, row in block, col in block, C, P, P] -> a time axis after C, repeated.
    frames = np.repeat(blocks[:, :, :, :, :, None], t, axis=5)
    return frames.reshape(gh * gw, c * t * p * p), (1, gh, gw)


def preprocess(images, settings: ImageSettings = QWEN2_5_VL) -> tuple[torch.Tensor, torch.Tensor]:
    """PIL images (or HxWx3 uint8 arrays) -> (pixel_values float32 [patches, C*T*P*P], grid_thw int64 [n, 3])."""
    patches, grids = [], []
    for image in images:
        flat, grid = patchify(_normalised(image, settings), settings)
        patches.append(flat)
        grids.append(grid)
    if not patches:
        raise ValueError("no images to process")
    return torch.from_numpy(np.concatenate(patches)), torch.tensor(grids, dtype=torch.int64)
