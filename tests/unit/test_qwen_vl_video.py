"""Videos in Qwen2.5-VL training samples, against transformers, in this process, fp32.

* Frames to patches (adaptor.mm.qwen_vl.video_processor): three frames of 56x84 pixels (kept) and of 33x61
  (resized) give a (2, h, w) grid, the third frame repeated to fill the second group of two; each row's
  two time slices are the rows transformers' Qwen2-VL image processor gives the two frames of its group
  (that processor repeats a still image over the same slices, and its video processor, which needs
  torchvision, groups frames this way). Frames of two sizes are one line.
* A record ``<image>...<video>...`` whose video is a directory of those frames and whose second video is
  a list of frame files (data.json ``attr.videos``): the sample's ``<|video_pad|>`` runs hold t*h*w/4
  tokens each, its 3-D positions are transformers' ``get_rope_index`` with ``second_per_grid_ts`` =
  temporal_patch_size / video_fps, and our model (tiny random Qwen2.5-VL loaded from its Hugging Face
  directory) fed the micro-batch gives ``Qwen2_5_VLForConditionalGeneration``'s logits within 1e-4, also
  after pretrain_mm.py's TP broadcast; other video pixels move the logits.
* Qwen3-VL's model (tiny random, deepstack after decoder layer 0) fed an image and a two-frame video, each
  frame after timestamp text, gives ``Qwen3VLForConditionalGeneration``'s logits within 1e-4: the
  deepstack rows of images and videos join in token order as there.
* One line each: a Qwen3-VL sample with a video (its timestamped frames are not built by the data
  pipeline), a video file without PyAV installed, a ``<video>`` marker without a video.
"""
from __future__ import annotations

import importlib.util
import json
from argparse import Namespace

import pytest
import torch

from helpers.hf_fixtures import VL_IMAGE_TOKEN, VL_VIDEO_TOKEN, VL_VISION_START, make_tiny_qwen2_5_vl, make_tiny_qwen3_vl
from helpers.processes import import_tool

from adaptor.mm.data import MMDataError
from adaptor.mm.qwen_vl.image_processor import QWEN2_5_VL
from adaptor.mm.qwen_vl.video_processor import preprocess_video, video_settings

MIN_PIXELS, MAX_PIXELS = 28 * 28, 28 * 28 * 16
FPS = 4.0  # second_per_grid_ts 0.5: video groups one position apart (tokens_per_second 2)
# The sample tokenizer's <|image_pad|>, <|video_pad|>, <|vision_start|> (tools/make_sample_vl_data.py).
VISION_TOKEN_IDS, VOCAB = (1438, 1439, 1436), 1440


def frames(size, count, seed):
    from PIL import Image

    gen = torch.Generator().manual_seed(seed)
    w, h = size
    return [Image.fromarray(torch.randint(0, 256, (h, w, 3), generator=gen, dtype=torch.uint8).numpy())
            for _ in range(count)]


def test_frames_group_as_transformers_lays_out_frames():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    settings = video_settings(QWEN2_5_VL, MIN_PIXELS, MAX_PIXELS)
    reference = Qwen2VLImageProcessorPil(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})
    for size, grid in (((84, 56), (2, 4, 6)), ((61, 33), (2, 2, 4))):
        video = frames(size, 3, seed=size[0])
        rows, got_grid = preprocess_video(video, settings)
        assert got_grid == grid
        still = [reference(images=[f], return_tensors="pt") for f in video]
        assert all(s["image_grid_thw"].tolist() == [[1, *grid[1:]]] for s in still)
        # rows: C, T, P, P; the image processor's T slices are the same frame twice.
        slices = [s["pixel_values"].view(-1, 3, 2, 14, 14)[:, :, 0] for s in still]
        groups = [torch.stack([slices[0], slices[1]], 2), torch.stack([slices[2], slices[2]], 2)]
        assert torch.equal(rows, torch.cat([g.reshape(g.shape[0], -1) for g in groups]))
    with pytest.raises(ValueError, match=r"^a video's frames differ in size \(33x61, 56x84\)$"):
        preprocess_video(frames((84, 56), 1, 0) + frames((61, 33), 1, 0), settings)


@pytest.fixture(scope="module")
def work(tmp_path_factory, model_parallel):
    """A tokenizer with the vision tokens, an image, two videos (a frame directory, a frame list), a data.json
    of one record, a tiny Hugging Face Qwen2.5-VL and transformers' model of it."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    root = tmp_path_factory.mktemp("vl_video")
    import_tool("make_sample_vl_data").add_vision_tokens(import_tool("make_sample_vl_data").BASE_TOKENIZER,
                                                         root / "tokenizer")
    frames((84, 56), 1, 5)[0].save(root / "still.png")
    (root / "clip").mkdir()
    for i, frame in enumerate(frames((84, 56), 3, 6)):
        frame.save(root / "clip" / f"frame_{i:03d}.png")
    for i, frame in enumerate(frames((56, 56), 2, 7)):
        frame.save(root / f"short_{i}.png")
    (root / "movie.mp4").write_bytes(b"")
    record = {"messages": [{"role": "user", "content": "<image>Look.<video>What moves?<video>And here?"},
                           {"role": "assistant", "content": "A dot."}],
              "images": ["still.png"], "videos": ["clip", ["short_0.png", "short_1.png"]]}
    data = {"dataset_param": {
        "dataset_type": "huggingface",
        "preprocess_parameters": {"model_name_or_path": "tokenizer", "image_min_pixels": MIN_PIXELS,
                                  "image_max_pixels": MAX_PIXELS, "video_min_pixels": MIN_PIXELS,
                                  "video_max_pixels": MAX_PIXELS, "video_fps": FPS},
        "basic_parameters": {"template": "qwen2vl", "dataset_dir": ".", "dataset": "records.json"},
        "attr": {"images": "images", "videos": "videos", "messages": "messages", "role_tag": "role",
                 "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}},
        "dataloader_param": {"shuffle": False}}
    (root / "records.json").write_text(json.dumps([record]))
    (root / "data.json").write_text(json.dumps(data))
    hf_dir = make_tiny_qwen2_5_vl(root / "hf", seed=2, vocab_size=VOCAB, vision_token_ids=VISION_TOKEN_IDS)
    hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    return root, record, hf_dir, hf


def dataset_of(root, model_id="qwen2_5vl", hf_dir=None):
    from adaptor.mm.config import load_model_config
    from adaptor.mm.qwen_vl.data_config import load_qwen_vl_data_config
    from adaptor.mm.qwen_vl.dataset import build_train_dataset

    model = {"model_id": model_id} if hf_dir is None else load_model_config(write_model_json(root, hf_dir))
    return build_train_dataset(Namespace(seq_length=256, seed=1, mm_skip_bad_records=False),
                               load_qwen_vl_data_config(root / "data.json"), model, 1)


def write_model_json(root, hf_dir) -> str:
    doc = {"model_id": "qwen2_5vl", "init_from_hf_path": str(hf_dir),
           "image_encoder": {"vision_encoder": {"model_id": "qwen2vit"}, "vision_projector": {"model_id": "lnmlp"}},
           "text_decoder": {"model_id": "qwen2_5_lm"}}
    (root / "model.json").write_text(json.dumps(doc))
    return str(root / "model.json")


def test_video_sample_positions_and_logits_equal_transformers(work):
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from adaptor.convert import HfCheckpoint, Layout
    from adaptor.mm.config import load_model_config
    from adaptor.mm.qwen_vl.checkpoint import load_hf_into
    from adaptor.mm.qwen_vl.dataset import collate
    from adaptor.mm.qwen_vl.decoder import decoder_transformer_config
    from adaptor.mm.qwen_vl.model import QwenVLModel
    from adaptor.mm.qwen_vl.model_json import text_config, vision_settings
    from adaptor.mm.qwen_vl.rope_index import token_types
    from adaptor.mm.qwen_vl.steps import broadcast_batch

    root, _, hf_dir, hf = work
    dataset = dataset_of(root, hf_dir=hf_dir)
    batch = collate([dataset[0]], pad_id=dataset.pad_id)
    image_id, video_id, _ = VISION_TOKEN_IDS
    grid = batch["video_grid_thw"]
    assert grid.tolist() == [[2, 4, 6], [1, 4, 4]] and batch["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert batch["pixel_values_videos"].shape == (48 + 16, 3 * 2 * 14 * 14)
    ids = batch["tokens"]
    runs = torch.diff(torch.cat([torch.tensor([0]), (ids[0] == video_id).int(), torch.tensor([0])])).tolist()
    starts = [i for i, d in enumerate(runs) if d == 1]
    ends = [i for i, d in enumerate(runs) if d == -1]
    assert [e - s for s, e in zip(starts, ends)] == [12, 4]  # t*h*w / merge^2
    types = token_types(ids, image_id, video_id)
    seconds = torch.tensor([2 / FPS, 2 / FPS])
    want_positions, _ = hf.model.get_rope_index(ids, types, image_grid_thw=batch["image_grid_thw"],
                                                video_grid_thw=grid, second_per_grid_ts=seconds)
    assert torch.equal(batch["position_ids"], want_positions)

    model_cfg = load_model_config(root / "model.json")
    model_parallel_cuda_manual_seed(1)
    text = text_config(model_cfg)
    model = QwenVLModel(vision_settings(model_cfg), text, decoder_transformer_config(text, use_cpu_initialization=True),
                        image_token_id=image_id, video_token_id=video_id, vocab_size=text.vocab_size).eval()
    load_hf_into(model, HfCheckpoint(hf_dir), Layout(), 0, 0)
    with torch.no_grad():
        want = hf(input_ids=ids, pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
                  pixel_values_videos=batch["pixel_values_videos"], video_grid_thw=grid,
                  second_per_grid_ts=seconds, mm_token_type_ids=types).logits
        sent = broadcast_batch(batch)
        assert all(torch.equal(sent[k].cpu(), v) for k, v in batch.items())
        got = model(sent["tokens"], sent["position_ids"], sent["pixel_values"], sent["image_grid_thw"],
                    pixel_values_videos=sent["pixel_values_videos"], video_grid_thw=sent["video_grid_thw"])
        error = (got - want).abs().max().item()
        print(f"video sample: max abs logit difference {error:.1e} (max |logit| {want.abs().max():.2f})")
        assert got.shape == want.shape and error < 1e-4, error
        moved = model(ids, batch["position_ids"], batch["pixel_values"], batch["image_grid_thw"],
                      pixel_values_videos=batch["pixel_values_videos"] + 1.0, video_grid_thw=grid)
        assert (moved - got).abs().max() > 1e-3


def test_qwen3_vl_model_with_an_image_and_a_video_equals_transformers(tmp_path, model_parallel):
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from transformers import Qwen3VLForConditionalGeneration

    from adaptor.convert import HfCheckpoint, Layout
    from adaptor.mm.config import load_model_config
    from adaptor.mm.qwen_vl.checkpoint import load_hf_into
    from adaptor.mm.qwen_vl.decoder import decoder_transformer_config
    from adaptor.mm.qwen_vl.model import QwenVLModel
    from adaptor.mm.qwen_vl.model_json import text_config, vision_settings
    from adaptor.mm.qwen_vl.rope_index import token_types

    hf_dir = make_tiny_qwen3_vl(tmp_path / "hf")
    hf = Qwen3VLForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
    doc = {"model_id": "qwen3vl", "init_from_hf_path": str(hf_dir),
           "image_encoder": {"vision_encoder": {"model_id": "qwen3vit"}, "vision_projector": {"model_id": "lnmlp"}},
           "text_decoder": {"model_id": "qwen3lm"}}
    (tmp_path / "model.json").write_text(json.dumps(doc))
    model_cfg = load_model_config(tmp_path / "model.json")
    model_parallel_cuda_manual_seed(1)
    text = text_config(model_cfg)
    model = QwenVLModel(vision_settings(model_cfg), text, decoder_transformer_config(text, use_cpu_initialization=True),
                        image_token_id=VL_IMAGE_TOKEN, video_token_id=VL_VIDEO_TOKEN, vocab_size=text.vocab_size)
    load_hf_into(model.eval(), HfCheckpoint(hf_dir), Layout(), 0, 0)
    # text, an image of 2x2 merged tokens, then two video frames of 2x2 each, each after "timestamp" text
    ids = torch.tensor([[3, VL_VISION_START] + [VL_IMAGE_TOKEN] * 4 + [5, 7, VL_VISION_START] + [VL_VIDEO_TOKEN] * 4
                        + [8, VL_VISION_START] + [VL_VIDEO_TOKEN] * 4 + [9, 10]])
    image_grid, video_grid = torch.tensor([[1, 4, 4]]), torch.tensor([[2, 4, 4]])
    gen = torch.Generator().manual_seed(4)
    width = 3 * 2 * 16 * 16
    pixels, video = torch.randn(16, width, generator=gen), torch.randn(32, width, generator=gen)
    types = token_types(ids, VL_IMAGE_TOKEN, VL_VIDEO_TOKEN)
    positions, _ = hf.model.get_rope_index(ids, types, image_grid_thw=image_grid, video_grid_thw=video_grid)
    with torch.no_grad():
        want = hf(input_ids=ids, pixel_values=pixels, image_grid_thw=image_grid, pixel_values_videos=video,
                  video_grid_thw=video_grid, mm_token_type_ids=types).logits
        got = model(ids, positions, pixels, image_grid, pixel_values_videos=video, video_grid_thw=video_grid)
    error = (got - want).abs().max().item()
    print(f"Qwen3-VL image + video: max abs logit difference {error:.1e} (max |logit| {want.abs().max():.2f})")
    assert got.shape == want.shape and error < 1e-4, error


def test_video_problems_are_one_line(work):
    from adaptor.mm.qwen_vl.records import VLRecord

    root, _, _, _ = work
    qwen3 = dataset_of(root, "qwen3vl")
    record = qwen3.records[0]
    with pytest.raises(MMDataError) as info:
        qwen3.builder.build(record)
    assert str(info.value) == (f"{record.where}: videos are read for Qwen2.5-VL (a timestamp before each frame "
                               f"is not built here)")
    builder = dataset_of(root).builder
    if importlib.util.find_spec("av") is None:
        movie = VLRecord(record.where, None, record.turns, record.images, (str(root / "movie.mp4"), record.videos[1]))
        with pytest.raises(MMDataError) as info:
            builder.build(movie)
        assert str(info.value) == (f"{record.where}: video 0: video movie.mp4: decoding a video file needs PyAV "
                                   f"(pip install av), or give the video as a directory or list of frame images")
    one_video = VLRecord(record.where, None, record.turns, record.images, record.videos[:1])
    with pytest.raises(MMDataError) as info:
        builder.build(one_video)
    assert str(info.value) == (f"{record.where}: the text holds 2 video placeholders (<|video_pad|> written "
                               f"literally?) for 1 videos")
