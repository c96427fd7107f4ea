"""The Qwen2.5-VL and Qwen3-VL vision side against transformers, in this process (fp32, tiny models).

* The image processor gives the same pixel values (bit for bit) and grids as transformers'
  ``Qwen2VLImageProcessorPil`` for tiny, odd, wide, over-the-maximum and under-the-minimum images (and a
  half-transparent and a grey one), with Qwen2.5-VL's numbers and with Qwen3-VL's (16-pixel patches,
  mean and std 0.5).
* Two images of different sizes in one call (grids 2x2 and 4x6 patches): the Qwen2.5-VL tower, with one
  windowed block (two windows of unequal size in the larger image), one full-attention block and one
  more windowed block, loaded from a random ``Qwen2_5_VisionTransformerPretrainedModel``, gives its
  merged tokens within 1e-5 (relative to the largest); the Qwen3-VL tower its merged tokens and both
  deepstack outputs, with the learned position table resampled from 4x4 to each grid.
  Each image run alone gives the tokens it got in the batch (images do not see each other); a 2-frame
  clip beside an image matches too (frames attend to themselves, windows are cut per frame).
* Weights: Hugging Face -> tower -> Hugging Face is bit-exact for both families, under either prefix;
  a tensor-parallel rank's qkv holds its heads' query, key and value rows, its gated fc1 its gate then
  its up rows.
* Patch rows that do not match ``grid_thw`` are one ValueError line naming both counts.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("ADAPTOR_BACKEND", "cpu")

from adaptor.mm.qwen_vl import weights  # noqa: E402
from adaptor.mm.qwen_vl.image_processor import image_settings, preprocess  # noqa: E402
from adaptor.mm.qwen_vl.settings import VisionSettings  # noqa: E402

# data.json's image_min_pixels / image_max_pixels, small enough for tiny images
QWEN25_IMAGES = image_settings("qwen2_5_vl", min_pixels=28 * 28, max_pixels=28 * 28 * 40)
QWEN3_IMAGES = image_settings("qwen3_vl", min_pixels=32 * 32, max_pixels=32 * 32 * 40)
TOLERANCE = 1e-5


def _images(*sizes, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def _randomised(model):
    """Weights far from their initial values (norms included), so that every tensor's mapping shows."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1234)  # the towers' megatron layers draw their initial weights from it
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def _relative(ours, ref) -> float:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture(scope="module")
def qwen25(model_parallel):
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from adaptor.mm.qwen_vl.vision import Qwen25VisionTower

    config = Qwen2_5_VLConfig(vision_config=dict(
        depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=40, window_size=56,
        fullatt_block_indexes=[1])).vision_config
    hf = _randomised(Qwen2_5_VisionTransformerPretrainedModel._from_config(config))
    settings = VisionSettings.from_hf("qwen2_5_vl", config)
    tower = Qwen25VisionTower(settings, use_cpu_initialization=True).eval()
    state = {f"visual.{k}": v for k, v in hf.state_dict().items()}  # the prefix of Qwen2.5-VL's files
    weights.load_hf(tower, state)
    return hf, tower, state


@pytest.fixture(scope="module")
def qwen3(model_parallel):
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    from adaptor.mm.qwen_vl.vision import Qwen3VisionTower

    config = Qwen3VLConfig(vision_config=dict(
        depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=40, num_position_embeddings=16,
        deepstack_visual_indexes=[0, 2])).vision_config
    hf = _randomised(Qwen3VLVisionModel._from_config(config))
    settings = VisionSettings.from_hf("qwen3_vl", config)
    tower = Qwen3VisionTower(settings, use_cpu_initialization=True).eval()
    state = {f"model.visual.{k}": v for k, v in hf.state_dict().items()}
    weights.load_hf(tower, state)
    return hf, tower, state


def test_image_processor_equals_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # tiny (grown to the minimum), odd, wide, over the maximum (shrunk), exact multiples; half transparent, grey
    images = _images((5, 7), (33, 61), (40, 300), (500, 380), (28, 28), (56, 84))
    images += [images[1].convert("RGBA"), images[2].convert("L")]
    images[-2].putalpha(images[-2].getchannel("R"))
    for settings, expect_grids in ((QWEN25_IMAGES, [[1, 2, 4], [1, 2, 4], [1, 2, 22], [1, 14, 10], [1, 2, 2],
                                                    [1, 4, 6], [1, 2, 4], [1, 2, 22]]),
                                   (QWEN3_IMAGES, [[1, 2, 4], [1, 2, 4], [1, 2, 18], [1, 14, 10], [1, 2, 2],
                                                   [1, 4, 6], [1, 2, 4], [1, 2, 18]])):
        reference = Qwen2VLImageProcessorPil(
            patch_size=settings.patch_size, merge_size=settings.merge_size, image_mean=list(settings.mean),
            image_std=list(settings.std), size={"shortest_edge": settings.min_pixels,
                                                "longest_edge": settings.max_pixels})
        for image in images:
            pixels, grid = preprocess([image], settings)
            want = reference(images=[image], return_tensors="pt")
            assert torch.equal(grid, want["image_grid_thw"]), (image.size, grid, want["image_grid_thw"])
            assert torch.equal(pixels, want["pixel_values"]), image.size
        pixels, grid = preprocess(images, settings)  # several at once: concatenated in order
        want = reference(images=images, return_tensors="pt")
        assert torch.equal(pixels, want["pixel_values"]) and torch.equal(grid, want["image_grid_thw"])
        assert grid.tolist() == expect_grids


def _two_images(settings, side: int):
    pixels, grid = preprocess(_images((side, side), (2 * side, 3 * side), seed=1), settings)
    assert grid.tolist() == [[1, 2, 2], [1, 4, 6]]
    return pixels, grid


def _two_frame_clip(tower):
    """A 2-frame clip of 4x6 patches next to a still image: each frame attends to itself."""
    frames = torch.tensor([[2, 4, 6], [1, 2, 2]])
    return torch.randn(2 * 24 + 4, tower.settings.patch_dim, generator=torch.Generator().manual_seed(2)), frames


def test_qwen25_tower_equals_transformers_on_two_images(qwen25):
    from adaptor.mm.qwen_vl import vision_grid as positions

    hf, tower, _ = qwen25
    pixels, grid = _two_images(QWEN25_IMAGES, 28)
    # window_size 56 px = 2x2 merged tokens: the 1x1 image is one window, the 2x3 one two of 4 and 2 tokens
    _, lengths = positions.window_order(grid, 2, 2)
    assert lengths == [4, 16, 8]
    with torch.no_grad():
        want = hf(pixels, grid_thw=grid).pooler_output
        got = tower(pixels, grid)
        alone = tower(pixels[4:], grid[1:])
    assert got.shape == (1 + 6, 40)
    assert _relative(got, want) < TOLERANCE
    assert _relative(alone, got[1:]) < TOLERANCE
    clip, frames = _two_frame_clip(tower)
    with torch.no_grad():
        assert _relative(tower(clip, frames), hf(clip, grid_thw=frames).pooler_output) < TOLERANCE


def test_qwen3_tower_and_deepstack_equal_transformers_on_two_images(qwen3):
    hf, tower, _ = qwen3
    pixels, grid = _two_images(QWEN3_IMAGES, 32)
    with torch.no_grad():
        want = hf(pixels, grid_thw=grid)
        got, deepstack = tower(pixels, grid)
        alone, alone_deepstack = tower(pixels[4:], grid[1:])
    assert _relative(got, want.pooler_output) < TOLERANCE
    assert len(deepstack) == len(want.deepstack_features) == 2
    for ours, ref in zip(deepstack, want.deepstack_features):
        assert _relative(ours, ref) < TOLERANCE
    assert _relative(alone, got[1:]) < TOLERANCE and _relative(alone_deepstack[1], deepstack[1][1:]) < TOLERANCE
    clip, frames = _two_frame_clip(tower)
    with torch.no_grad():
        got, deepstack = tower(clip, frames)
        want = hf(clip, grid_thw=frames)
    assert _relative(got, want.pooler_output) < TOLERANCE
    assert _relative(deepstack[0], want.deepstack_features[0]) < TOLERANCE


def test_weight_mapping_round_trip_and_tensor_parallel_slices(qwen25, qwen3):
    for (_, tower, state), prefix in ((qwen25, "visual."), (qwen3, "model.visual.")):
        back = weights.to_hf(tower.state_dict(), tower.settings, prefix=prefix)
        assert back.keys() == state.keys()
        assert all(torch.equal(back[k], state[k]) for k in state)
    _, tower, state = qwen25
    heads, dim, tp = 2, 16, 2
    for rank in range(tp):
        mine = weights.from_hf(state, tower.settings, tp=tp, rank=rank)
        qkv = state["visual.blocks.0.attn.qkv.weight"].view(3, heads, dim, -1)
        assert torch.equal(mine["layers.0.self_attention.linear_qkv.weight"], qkv[:, rank].reshape(3 * dim, -1))
        gate, up = state["visual.blocks.0.mlp.gate_proj.weight"], state["visual.blocks.0.mlp.up_proj.weight"]
        halves = torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
        assert torch.equal(mine["layers.0.mlp.linear_fc1.weight"], halves)
        down = state["visual.blocks.0.mlp.down_proj.weight"]
        assert torch.equal(mine["layers.0.mlp.linear_fc2.weight"], down.chunk(tp, dim=1)[rank])
        assert torch.equal(mine["layers.0.mlp.linear_fc2.bias"], state["visual.blocks.0.mlp.down_proj.bias"])


def test_patch_rows_that_do_not_match_the_grid_are_one_line(qwen25):
    _, tower, _ = qwen25
    pixels, grid = _two_images(QWEN25_IMAGES, 28)
    with pytest.raises(ValueError) as info:
        tower(pixels[:-4], grid)
    assert str(info.value) == "pixel_values has 24 patch rows but grid_thw [[1, 2, 2], [1, 4, 6]] describes 28"
