"""The Qwen-VL data side (adaptor/mm/qwen_vl/dataset.py) against transformers, in this process.

The reference is transformers' ``Qwen2_5_VLProcessor`` (its ``apply_chat_template`` with Qwen2.5-VL's
published chat template, its ``Qwen2VLImageProcessorPil``) on the example tokenizer with the vision tokens
added (tools/make_sample_vl_data.py), and ``Qwen2_5_VLModel.get_rope_index``:

* a rendered sample (default system prompt, two turns, one image) has the reference's token ids, pixel
  values and grid; its loss covers exactly the two replies (text, ``<|im_end|>``, newline); its
  positions are the reference's; a two-image sample likewise, images in order;
* a micro-batch of samples with images of different sizes: shapes, padding, images concatenated;
* with Qwen3-VL's settings (model_id qwen3vl): 16-pixel patches and Qwen3's positions;
* bad input is one line naming file and record: an image beyond the sequence, more ``<image>``
  markers than images (and fewer), a missing image file; a data.json key not built names its JSON path.
"""
from __future__ import annotations

import json
import os
import warnings
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch

os.environ.setdefault("ADAPTOR_BACKEND", "cpu")

from helpers.processes import import_tool  # noqa: E402

from adaptor.mm.config import MMConfigError  # noqa: E402
from adaptor.mm.data import MMDataError  # noqa: E402
from adaptor.mm.qwen_vl.data_config import check_paths, load_mm_data_config, load_qwen_vl_data_config  # noqa: E402
from adaptor.mm.qwen_vl.dataset import build_train_dataset, collate, data_loader  # noqa: E402
from helpers.paths import ROOT  # noqa: E402

sample_data = import_tool("make_sample_vl_data")

# Qwen2.5-VL's published chat template (images and text parts; videos left out).
QWEN25_VL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}")
MIN_PIXELS, MAX_PIXELS = 28 * 28, 28 * 28 * 12
SEQ = 96
RECORDS = [
    {"messages": [{"role": "user", "content": "<image>What is drawn?"},
                  {"role": "assistant", "content": "A red circle."},
                  {"role": "user", "content": "Which colour?"}, {"role": "assistant", "content": "Red."}],
     "images": ["wide.png"]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Compare <image> and <image>"},
                  {"role": "assistant", "content": "Both are boxes."}], "images": ["small.png", "tall.png"]},
]
SIZES = {"wide.png": (84, 56), "small.png": (28, 28), "tall.png": (42, 70), "big.png": (280, 280)}


def data_json(folder, records, name="data.json", **basic):
    (folder / f"{name}.records.json").write_text(json.dumps(records))
    cfg = {"dataset_param": {
        "dataset_type": "huggingface",
        "preprocess_parameters": {"model_name_or_path": "tokenizer", "image_min_pixels": MIN_PIXELS,
                                  "image_max_pixels": MAX_PIXELS, "video_fps": 2.0},
        "basic_parameters": {"template": "qwen2vl", "dataset_dir": ".", "dataset": f"{name}.records.json",
                             "max_samples": None, **basic},
        "attr": {"images": "images", "messages": "messages", "role_tag": "role", "content_tag": "content",
                 "user_tag": "user", "assistant_tag": "assistant", "videos": None}},
        "dataloader_param": {"shuffle": False, "collate_param": {"model_name": "qwen2vl"}}}
    (folder / name).write_text(json.dumps(cfg))
    return folder / name


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from PIL import Image

    out = tmp_path_factory.mktemp("vldata")
    sample_data.add_vision_tokens(sample_data.BASE_TOKENIZER, out / "tokenizer")
    gen = torch.Generator().manual_seed(0)
    for name, (w, h) in SIZES.items():
        pixels = torch.randint(0, 256, (h, w, 3), generator=gen, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(out / name)
    return out


@pytest.fixture(scope="module")
def reference(folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLProcessor
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        class ImageTextProcessor(Qwen2_5_VLProcessor):
            """Without the video processor (it needs torchvision); images and text as published."""

            @classmethod
            def get_attributes(cls):
                return ["image_processor", "tokenizer"]

        tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"))
        images = Qwen2VLImageProcessorPil(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})
        processor = ImageTextProcessor(image_processor=images, tokenizer=tokenizer, chat_template=QWEN25_VL_TEMPLATE)
    # get_rope_index reads only the vision config's merge size and tokens per second.
    model = SimpleNamespace(config=Qwen2_5_VLConfig())
    model.get_vision_position_ids = Qwen2_5_VLModel.get_vision_position_ids.__get__(model)
    rope_index = Qwen2_5_VLModel.get_rope_index.__get__(model)
    return processor, tokenizer, rope_index


def args(**kw):
    return Namespace(**{"seq_length": SEQ, "seed": 1, "mm_skip_bad_records": False, **kw})


@pytest.fixture(scope="module")
def dataset(folder):
    return build_train_dataset(args(), load_qwen_vl_data_config(data_json(folder, RECORDS)),
                               {"model_id": "qwen2_5vl"}, 4)


def reference_sample(processor, folder, record):
    from PIL import Image

    images = iter(record["images"])
    messages = []
    for message in record["messages"]:
        parts = []
        for i, text in enumerate(message["content"].split("<image>")):
            if i:
                parts.append({"type": "image", "image": Image.open(folder / next(images))})
            if text:
                parts.append({"type": "text", "text": text})
        messages.append({"role": message["role"], "content": parts})
    return processor.apply_chat_template(messages, tokenize=True, return_dict=True,
                                         processor_kwargs={"return_tensors": "pt", "return_mm_token_type_ids": True})


def loss_runs(tokenizer, sample) -> list[str]:
    """The labels in the loss, decoded one contiguous run at a time."""
    runs, current = [], []
    for label, loss in zip(sample["labels"].tolist(), sample["loss_mask"].tolist()):
        if loss:
            current.append(label)
        elif current:
            runs, current = runs + [current], []
    runs += [current] if current else []
    return [tokenizer.decode(run, skip_special_tokens=False) for run in runs]


def test_samples_equal_transformers(reference, folder, dataset):
    processor, tokenizer, rope_index = reference
    replies = [["A red circle.<|im_end|>\n", "Red.<|im_end|>\n"], ["Both are boxes.<|im_end|>\n"]]
    for index, record in enumerate(RECORDS):
        mine = dataset[index]
        want = reference_sample(processor, folder, record)
        ids = torch.cat([mine["tokens"], mine["labels"][-1:]])
        assert ids.tolist() == want["input_ids"][0].tolist()
        assert torch.equal(mine["labels"][:-1], mine["tokens"][1:])
        assert torch.equal(mine["pixel_values"], want["pixel_values"])
        assert torch.equal(mine["image_grid_thw"], want["image_grid_thw"])
        assert loss_runs(tokenizer, mine) == replies[index]
        positions, _ = rope_index(want["input_ids"], want["mm_token_type_ids"], image_grid_thw=want["image_grid_thw"])
        assert torch.equal(mine["position_ids"], positions[:, 0, :-1])
        assert mine["position_ids"].dtype == torch.long and mine["loss_mask"].dtype == torch.float32
    assert dataset[1]["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 4]]  # two sizes, in <image> order
    assert "Be brief." in tokenizer.decode(dataset[1]["tokens"].tolist())


def test_loss_options_and_truncation(reference, folder, dataset):
    _, tokenizer, _ = reference
    full = dataset[0]
    last_only = build_train_dataset(args(), str(data_json(folder, RECORDS[:1], "history.json", mask_history=True)),
                                    None, 1)[0]
    assert loss_runs(tokenizer, last_only) == ["Red.<|im_end|>\n"]
    everything = build_train_dataset(args(), str(data_json(folder, RECORDS[:1], "prompt.json", train_on_prompt=True)),
                                     None, 1)[0]
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert torch.equal(everything["loss_mask"].bool(), everything["labels"] != image_pad)
    # cut after the image: the first tokens of the whole sample, their positions and loss unchanged
    for limit, cut in ((args(seq_length=45), None), (args(), 46)):
        path = data_json(folder, RECORDS[:1], "cut.json", cutoff_len=cut)
        short = build_train_dataset(limit, str(path), None, 1)[0]
        assert len(short["tokens"]) == 45 < len(full["tokens"])
        for key in ("tokens", "labels", "loss_mask"):
            assert torch.equal(short[key], full[key][:45]), key
        assert torch.equal(short["position_ids"], full["position_ids"][:, :45])


def test_micro_batch_of_different_images(dataset):
    samples = [dataset[0], dataset[1], dataset[2]]  # epoch 2 starts again at record 0
    batch = collate(samples, pad_id=dataset.pad_id)
    lengths = [len(s["tokens"]) for s in samples]
    b, s = 3, max(lengths)
    assert {k: list(v.shape) for k, v in batch.items()} == {
        "tokens": [b, s], "labels": [b, s], "loss_mask": [b, s], "position_ids": [3, b, s],
        "pixel_values": [sum(len(x["pixel_values"]) for x in samples), 3 * 2 * 14 * 14], "image_grid_thw": [4, 3],
        "pixel_values_videos": [0, 3 * 2 * 14 * 14], "video_grid_thw": [0, 3]}
    assert batch["pixel_values"].dtype == torch.float32 and batch["image_grid_thw"].dtype == torch.int64
    assert torch.equal(batch["pixel_values"], torch.cat([x["pixel_values"] for x in samples]))
    short = lengths.index(min(lengths))
    assert (batch["tokens"][short, min(lengths):] == dataset.pad_id).all()
    assert batch["loss_mask"][short, min(lengths):].sum() == 0 and batch["position_ids"][:, short, min(lengths):].sum() == 0
    fixed = collate(samples, pad_id=dataset.pad_id, length=SEQ, multiple=8)
    assert fixed["tokens"].shape == (3, SEQ) and torch.equal(fixed["tokens"][:, :s], batch["tokens"])
    # The DataLoader collates for the layout: sequence parallel over TP 4 pads to a multiple of 4; pipeline
    # parallel to --seq-length
    sp_args = args(num_workers=0, pipeline_model_parallel_size=1, sequence_parallel=True, tensor_model_parallel_size=4)
    loaded = next(iter(data_loader(dataset, [[2, 3]], sp_args)))
    want = collate([dataset[2], dataset[3]], pad_id=dataset.pad_id, multiple=4)
    assert loaded["tokens"].shape[1] % 4 == 0 and all(torch.equal(loaded[k], want[k]) for k in want)
    pp_args = args(num_workers=0, pipeline_model_parallel_size=2)
    assert next(iter(data_loader(dataset, [[0]], pp_args)))["position_ids"].shape == (3, 1, SEQ)


def test_example_data_json(tmp_path):
    """examples/qwen25vl/data.json on what tools/make_sample_vl_data.py writes: a micro-batch of 4 samples."""
    (tmp_path / "data.json").write_text((ROOT / "examples" / "qwen25vl" / "data.json").read_text())
    assert sample_data.main(["--output-dir", str(tmp_path / "data"), "--count", "4"]) == 0
    cfg = load_mm_data_config(tmp_path / "data.json")
    check_paths(cfg)
    dataset = build_train_dataset(args(seq_length=256), cfg, None, 4)
    batch = collate([dataset[i] for i in range(4)], pad_id=dataset.pad_id)
    assert len(batch["image_grid_thw"]) == 5 and batch["loss_mask"].sum() > 0  # the 4th record has two images
    assert type(load_mm_data_config(ROOT / "examples" / "vlm" / "data.json")).__name__ == "MMDataConfig"


def test_qwen3_vl_family(reference, folder):
    """model_id qwen3vl: Qwen3-VL's 16-pixel patches and mean/std 0.5, no default system prompt, and
    the positions of transformers' Qwen3-VL get_rope_index."""
    from PIL import Image
    from transformers import Qwen3VLConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    _, tokenizer, _ = reference
    record = {**RECORDS[1], "messages": RECORDS[1]["messages"][1:]}  # no system message
    cfg = load_qwen_vl_data_config(data_json(folder, [record], "qwen3.json", template="qwen3_vl_nothink"))
    sample = build_train_dataset(args(), cfg, {"model_id": "qwen3vl"}, 1)[0]
    processor = Qwen2VLImageProcessorPil(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                         size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})
    want = processor(images=[Image.open(folder / "small.png"), Image.open(folder / "tall.png")], return_tensors="pt")
    want_pixels, want_grid = want["pixel_values"], want["image_grid_thw"]
    assert torch.equal(sample["pixel_values"], want_pixels) and torch.equal(sample["image_grid_thw"], want_grid)
    assert tokenizer.decode(sample["tokens"][:8].tolist()).startswith("<|im_start|>user\nCompare")
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((sample["tokens"] == image_pad).sum()) == int(want_grid.prod(-1).sum()) // 4
    model = SimpleNamespace(config=Qwen3VLConfig())
    model.get_vision_position_ids = Qwen3VLModel.get_vision_position_ids.__get__(model)
    ids = sample["tokens"][None]
    want, _ = Qwen3VLModel.get_rope_index.__get__(model)(ids, (ids == image_pad).long(), image_grid_thw=want_grid)
    assert torch.equal(sample["position_ids"], want[:, 0])


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_bad_input_is_one_line(folder):
    cases = [
        ([{**RECORDS[0], "images": ["big.png"]}], {"image_max_pixels": 28 * 28 * 100},
         r"record 0: image 0 \(400 patches\) ends at token \d+, past the 96 tokens a sample holds \(--seq-length 96\)"),
        ([RECORDS[0], {**RECORDS[0], "images": []}], {}, "record 1: 1 <image> markers but 0 images"),
        ([{**RECORDS[0], "images": ["wide.png", "small.png"]}], {}, "record 0: 1 <image> markers but 2 images"),
        ([{**RECORDS[0], "images": ["nowhere.png"]}], {}, "record 0: image nowhere.png: no such file"),
    ]
    for records, pre, pattern in cases:
        path = data_json(folder, records, "bad.json")
        if pre:
            raw = json.loads(path.read_text())
            raw["dataset_param"]["preprocess_parameters"].update(pre)
            path.write_text(json.dumps(raw))
        with pytest.raises(MMDataError) as exc:
            build_train_dataset(args(), str(path), None, 2)[0]
        assert f"{folder}/bad.json.records.json" in one_line(exc)
        assert exc.match(pattern)
    # JSON Lines: named by line
    path = data_json(folder, RECORDS, "lines.json")
    (folder / "lines.json.records.json").write_text(json.dumps(RECORDS[0]) + "\n\n" + json.dumps(
        {**RECORDS[1], "images": ["small.png", "gone.png"]}) + "\n")
    with pytest.raises(MMDataError) as exc:
        build_train_dataset(args(), str(path), None, 2)
    assert one_line(exc) == f"{folder}/lines.json.records.json:3: image gone.png: no such file"
    # skipped under --mm-skip-bad-records: the sample comes from the next good record
    path = data_json(folder, [{**RECORDS[0], "images": ["big.png"]}, RECORDS[1]], "bad.json")
    raw = json.loads(path.read_text())
    raw["dataset_param"]["preprocess_parameters"]["image_max_pixels"] = 28 * 28 * 100
    path.write_text(json.dumps(raw))
    skipping = build_train_dataset(args(mm_skip_bad_records=True), str(path), None, 2)
    assert skipping[0]["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 4]]

    for where, value, expect in [
        (("attr", "observation_tag"), "observation", r"dataset_param.attr.observation_tag: expected null"),
        (("basic_parameters", "streaming"), True, r"dataset_param.basic_parameters.streaming: unknown key"),
        (("basic_parameters", "template"), "llava", r"dataset_param.basic_parameters.template: \"llava\" is not one"),
    ]:
        path = data_json(folder, RECORDS, "keys.json")
        raw = json.loads(path.read_text())
        raw["dataset_param"][where[0]][where[1]] = value
        path.write_text(json.dumps(raw))
        with pytest.raises(MMConfigError) as exc:
            load_qwen_vl_data_config(path)
        assert one_line(exc).startswith(str(path)) and exc.match(expect)
