"""pretrain_mm.py's inputs, in this process: model.json/data.json checks, JSONL records, samples, images.

Every bad model.json/data.json case is one :class:`MMConfigError` naming the file and the JSON
path, and every bad record one :class:`MMDataError` naming file and line, or under the skip flag a
count per reason. (tests/e2e/test_pretrain_mm.py shows, for one case of each kind, that the same
message reaches the user as one ``megatron-adaptor: error:`` line with a non-zero exit: pretrain_mm.py
passes these messages to ``adaptor.errors.fail`` unchanged.)

Samples: the image token sits where the text marks it, loss falls on the caption/answer tokens and
their end-of-document token only, the text is cut or padded to the positions --seq-length leaves.
Images: RGB from any Pillow mode, resized, normalized with data.json's mean and std.
"""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest
import torch

from adaptor.mm.config import MMConfigError, load_data_config, load_model_config
from adaptor.mm.data import IMAGE_TOKEN_INDEX, ImageTextDataset, MMDataError, encode_turns, load_image, read_records
from helpers.paths import ROOT
EXAMPLE_MODEL = json.loads((ROOT / "examples" / "vlm" / "model.json").read_text())
EXAMPLE_DATA = json.loads((ROOT / "examples" / "vlm" / "data.json").read_text())


def write(path: Path, obj) -> str:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=2))
    return str(path)


def edited(base: dict, path: str, value=None, delete=False) -> dict:
    """A copy of ``base`` with the key at dotted ``path`` set to ``value`` (or deleted)."""
    out = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    if delete:
        del node[leaf]
    else:
        node[leaf] = value
    return out


# ------------------------------------------------------------------------------------- model.json
MODEL_CASES = {
    "missing key": (edited(EXAMPLE_MODEL, "image_encoder.vision_encoder.num_layers", delete=True),
                    "image_encoder.vision_encoder.num_layers: missing"),
    "missing section": (edited(EXAMPLE_MODEL, "text_decoder", delete=True), "text_decoder: missing"),
    "unknown key": (edited(EXAMPLE_MODEL, "text_decoder.num_layer", 2),
                    "text_decoder.num_layer: unknown key"),
    "wrong type": (edited(EXAMPLE_MODEL, "text_decoder.hidden_size", "128"),
                   'text_decoder.hidden_size: expected an integer, got "128"'),
    "bool as int": (edited(EXAMPLE_MODEL, "image_encoder.vision_encoder.num_layers", True),
                    "image_encoder.vision_encoder.num_layers: expected an integer, got true"),
    "unknown model_id": (edited(EXAMPLE_MODEL, "image_encoder.vision_encoder.model_id", "vit"),
                         'image_encoder.vision_encoder.model_id: "vit" is not one of "clip", "siglip"'),
    "image not patches": (edited(EXAMPLE_MODEL, "image_encoder.vision_encoder.image_size", 30),
                          "image_encoder.vision_encoder.image_size: 30 is not a multiple of patch_size 8"),
    "silu not gated": (edited(EXAMPLE_MODEL, "text_decoder.gated_linear_unit", False),
                       "text_decoder.activation_func: silu without gated_linear_unit"),
    "video encoder": (edited(EXAMPLE_MODEL, "video_encoder", {"model_id": "x"}), "video_encoder: expected null"),
    "everything frozen": (edited(edited(edited(EXAMPLE_MODEL, "text_decoder.freeze", True),
                                        "image_encoder.vision_encoder.freeze", True),
                                 "image_encoder.vision_projector.freeze", True), "every part is frozen"),
}


@pytest.mark.parametrize("case", MODEL_CASES)
def test_bad_model_json_names_the_json_path(case, tmp_path):
    obj, expected = MODEL_CASES[case]
    path = write(tmp_path / "model.json", obj)
    with pytest.raises(MMConfigError) as err:
        load_model_config(path)
    assert str(err.value).startswith(f"{path}: "), err.value
    assert expected in str(err.value), err.value


def test_model_json_not_json_names_the_line(tmp_path):
    path = write(tmp_path / "model.json", '{\n  "model_id": "llava",\n  "text_decoder": {,\n}')
    with pytest.raises(MMConfigError, match=rf"^{tmp_path}/model.json:3: not valid JSON"):
        load_model_config(path)


def test_example_model_json_and_defaults(tmp_path):
    cfg = load_model_config(ROOT / "examples" / "vlm" / "model.json")
    assert cfg.vision["model_id"] == "clip" and cfg.vision["drop_class_token"] is True
    assert cfg.text["swiglu"] is True and cfg.projector["model_id"] == "mlp"
    siglip = edited(EXAMPLE_MODEL, "image_encoder.vision_encoder", {
        "model_id": "siglip", "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 2,
        "patch_size": 8, "image_size": 32, "ckpt_path": "tower"})
    cfg = load_model_config(write(tmp_path / "model.json", siglip))
    assert (cfg.vision["activation_func"], cfg.vision["layernorm_epsilon"], cfg.vision["drop_class_token"]) == \
        ("gelu_tanh", 1e-6, False)
    assert cfg.vision["ckpt_path"] == str(tmp_path / "tower")  # relative to model.json's directory


def test_text_decoder_keys_name_megatron_arguments():
    """Each text_decoder key sets an argument Megatron's own parser has (a typo would set nothing)."""
    from megatron.training.arguments import add_megatron_arguments

    from adaptor.mm.config import TEXT_DECODER_ARGS

    dests = {a.dest for a in add_megatron_arguments(argparse.ArgumentParser(add_help=False))._actions}
    assert set(TEXT_DECODER_ARGS.values()) | {"swiglu", "group_query_attention"} <= dests


def test_flags_agree_with_model_json(tmp_path):
    from patches.multimodal.mm_arguments import apply_model_json

    cfg = load_model_config(ROOT / "examples" / "vlm" / "model.json")
    args = argparse.Namespace(num_layers=None, hidden_size=None, add_bias_linear=True, swiglu=False,
                              layernorm_epsilon=1e-5, tensor_model_parallel_size=1)
    apply_model_json(args, set(), cfg)
    assert (args.num_layers, args.hidden_size, args.add_bias_linear, args.swiglu, args.layernorm_epsilon,
            args.num_query_groups, args.group_query_attention) == (2, 128, False, True, 1e-6, 2, True)
    args = argparse.Namespace(num_layers=3, tensor_model_parallel_size=1)
    with pytest.raises(MMConfigError, match=r"text_decoder.num_layers is 2 but the command line has --num-layers 3"):
        apply_model_json(args, {"num_layers"}, cfg)
    args = argparse.Namespace(layernorm_epsilon=1e-5, tensor_model_parallel_size=1)
    with pytest.raises(MMConfigError, match=r"text_decoder.layernorm_epsilon is 1e-06 .* --norm-epsilon 1e-05"):
        apply_model_json(args, {"layernorm_epsilon"}, cfg)
    args = argparse.Namespace(add_bias_linear=False, tensor_model_parallel_size=1)
    biased = edited(EXAMPLE_MODEL, "text_decoder.add_bias_linear", True)
    with pytest.raises(MMConfigError, match=r"text_decoder.add_bias_linear is true but the command line has "
                                            r"--disable-bias-linear; drop the flag"):
        apply_model_json(args, {"add_bias_linear"}, load_model_config(write(tmp_path / "model.json", biased)))


# -------------------------------------------------------------------------------------- data.json
DATA_CASES = {
    "missing key": (edited(EXAMPLE_DATA, "dataset_param.basic_parameters.data_path", delete=True),
                    "dataset_param.basic_parameters.data_path: missing"),
    "unknown key": (edited(EXAMPLE_DATA, "dataloader_param.sampler_type", "BaseRandomBatchSampler"),
                    "dataloader_param.sampler_type: unknown key"),
    "unknown dataset_type": (edited(EXAMPLE_DATA, "dataset_param.dataset_type", "huggingface"),
                             'dataset_param.dataset_type: "huggingface" is not one of "multimodal"'),
    "mean not three": (edited(EXAMPLE_DATA, "dataset_param.preprocess_parameters.mean", [0.5, 0.5]),
                       "dataset_param.preprocess_parameters.mean: expected a list of three numbers"),
    "zero std": (edited(EXAMPLE_DATA, "dataset_param.preprocess_parameters.std", [0.5, 0, 0.5]),
                 "dataset_param.preprocess_parameters.std: must be positive"),
}


@pytest.mark.parametrize("case", DATA_CASES)
def test_bad_data_json_names_the_json_path(case, tmp_path):
    obj, expected = DATA_CASES[case]
    path = write(tmp_path / "data.json", obj)
    with pytest.raises(MMConfigError) as err:
        load_data_config(path)
    assert str(err.value).startswith(f"{path}: ") and expected in str(err.value), err.value


def test_data_json_paths_are_relative_to_it():
    cfg = load_data_config(ROOT / "examples" / "vlm" / "data.json")
    assert cfg.data_path == str(ROOT / "examples" / "vlm" / "data" / "captions.jsonl")
    assert Path(cfg.data_folder, "images", "0000.png").is_file()


# ------------------------------------------------------------------------------------------ records
def png(path: Path, colour=(200, 30, 30), size=(16, 12), mode="RGB") -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).convert(mode).save(path)
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    png(tmp_path / "good.png")
    (tmp_path / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not an image" * 10)
    whole = (png(tmp_path / "whole.png", size=(32, 32))).read_bytes()
    (tmp_path / "truncated.png").write_bytes(whole[: len(whole) // 2])
    return tmp_path


GOOD = {"image": "good.png", "caption": "a red box"}
RECORD_CASES = {
    "invalid JSON": ('{"image": "good.png", "caption": ', "not valid JSON", "invalid line"),
    "not an object": ("[1, 2]", "not a JSON object", "invalid line"),
    "missing image key": (json.dumps({"caption": "a red box"}), 'missing key "image"', "missing key"),
    "missing caption key": (json.dumps({"image": "good.png"}), 'missing key "caption" or "conversations"',
                            "missing key"),
    "empty caption": (json.dumps({"image": "good.png", "caption": "  "}), "empty caption", "empty caption"),
    "no answer": (json.dumps({"image": "good.png", "conversations": [{"from": "human", "value": "<image> hi"},
                                                                      {"from": "gpt", "value": ""}]}),
                  "no non-empty gpt answer", "empty caption"),
    "turn without value": (json.dumps({"image": "good.png", "conversations": [{"from": "human"}]}),
                           'conversations[0]: missing key "from" or "value"', "missing key"),
    "two images": (json.dumps({"image": "good.png", "conversations": [
        {"from": "human", "value": "<image> <image>"}, {"from": "gpt", "value": "two"}]}),
        "2 <image> markers", "bad conversations"),
    "missing image file": (json.dumps({"image": "nope.png", "caption": "x"}), "image nope.png: no such file",
                           "missing image"),
    "corrupt image": (json.dumps({"image": "garbage.png", "caption": "x"}), "image garbage.png: cannot decode",
                      "corrupt image"),
    "truncated image": (json.dumps({"image": "truncated.png", "caption": "x"}), "image truncated.png: cannot decode",
                        "corrupt image"),
}


@pytest.mark.parametrize("case", RECORD_CASES)
def test_bad_record_names_file_and_line(case, folder):
    line, expected, _ = RECORD_CASES[case]
    data = folder / "data.jsonl"
    data.write_text(json.dumps(GOOD) + "\n\n" + line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(MMDataError) as err:
        read_records(str(data), str(folder), skip_bad=False)
    assert str(err.value).startswith(f"{data}:3: "), err.value  # line 2 is blank: skipped, still counted
    assert expected in str(err.value), err.value


def test_skip_bad_records_counts_each_reason(folder):
    data = folder / "data.jsonl"
    lines = [json.dumps(GOOD)] + [line for line, _, _ in RECORD_CASES.values()] + [json.dumps(GOOD)]
    data.write_text("\n".join(lines) + "\n")
    records, skipped = read_records(str(data), str(folder), skip_bad=True)
    assert [r.line for r in records] == [1, len(lines)]
    expected = {}
    for _, _, reason in RECORD_CASES.values():
        expected[reason] = expected.get(reason, 0) + 1
    assert dict(skipped) == expected


def test_no_usable_record_is_an_error_even_when_skipping(folder):
    data = folder / "data.jsonl"
    data.write_text(json.dumps({"image": "nope.png", "caption": "x"}) + "\n")
    with pytest.raises(MMDataError, match=r"no usable records \(first bad: .*data.jsonl:1: image nope.png"):
        read_records(str(data), str(folder), skip_bad=True)


# ------------------------------------------------------------------------------------------ samples
class CharTokenizer:
    """One id per character (a=10, b=11, ...), eod 1, pad 2: the sample layout is easy to read back."""

    eod, pad = 1, 2

    def tokenize(self, text):
        return [ord(c) for c in text]


def dataset(records, text_len, cfg, skip=False, samples=4):
    return ImageTextDataset(records, samples, text_len, CharTokenizer(), cfg, seed=1, skip_bad=skip,
                            data_path="data.jsonl")


@pytest.fixture
def data_cfg(folder):
    cfg = load_data_config(ROOT / "examples" / "vlm" / "data.json")
    cfg.data_folder, cfg.image_size = str(folder), 8
    return cfg


def decode(ids):
    return "".join("<IMG>" if i == IMAGE_TOKEN_INDEX else "|" if i == 1 else "_" if i == 2 else chr(i) for i in ids)


def test_caption_sample_layout(folder, data_cfg):
    data = folder / "data.jsonl"
    data.write_text(json.dumps({"image": "good.png", "caption": "red box"}) + "\n")
    records, _ = read_records(str(data), str(folder), False)
    sample = dataset(records, 12, data_cfg)[0]
    assert decode(sample["tokens"].tolist()) == "<IMG>\nred box|__"
    assert decode(sample["labels"].tolist()) == "\nred box|___"
    # Loss on the caption and its eod: the newline after the image predicts the first caption token.
    assert "".join(c for c, m in zip(decode(sample["labels"].tolist()), sample["loss_mask"].tolist()) if m) == \
        "red box|"


def test_conversation_sample_layout_and_truncation(folder, data_cfg):
    data = folder / "data.jsonl"
    turns = [{"from": "human", "value": "what?"}, {"from": "gpt", "value": "red"},
             {"from": "human", "value": "size?"}, {"from": "gpt", "value": "small box"}]
    data.write_text(json.dumps({"image": "good.png", "conversations": turns}) + "\n")
    records, _ = read_records(str(data), str(folder), False)
    whole = dataset(records, 40, data_cfg)[0]
    text = decode(whole["labels"].tolist())
    assert decode(whole["tokens"].tolist()).startswith("<IMG>\nwhat?\nred|size?\nsmall box|")
    assert "".join(c for c, m in zip(text, whole["loss_mask"].tolist()) if m) == "red|small box|"
    cut = dataset(records, 14, data_cfg)[0]
    assert decode(cut["tokens"].tolist()) == "<IMG>\nwhat?\nred|si"
    assert cut["tokens"].shape == cut["labels"].shape == cut["loss_mask"].shape == (14,)


def test_image_marker_beyond_the_text_positions_is_a_bad_record(folder, data_cfg):
    data = folder / "data.jsonl"
    turns = [{"from": "human", "value": "a long question first <image>"}, {"from": "gpt", "value": "x"}]
    data.write_text(json.dumps({"image": "good.png", "conversations": turns}) + "\n")
    records, _ = read_records(str(data), str(folder), False)
    with pytest.raises(MMDataError, match=r"data.jsonl:1: the text before <image> is longer than the 8 text"):
        dataset(records, 8, data_cfg)[0]


def test_image_failing_at_load_time(folder, data_cfg):
    """An image that passed the check when the dataset was built and fails when a sample is made
    (the file changed since): the same one-line error, or under the skip flag the next record."""
    png(folder / "changes.png")
    data = folder / "data.jsonl"
    data.write_text(json.dumps({"image": "changes.png", "caption": "green"}) + "\n" + json.dumps(GOOD) + "\n")
    records, _ = read_records(str(data), str(folder), False)
    assert len(records) == 2
    (folder / "changes.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    data_cfg.shuffle = False
    with pytest.raises(MMDataError, match=r"^data.jsonl:1: image changes.png: cannot decode"):
        dataset(records, 16, data_cfg)[0]
    replaced = dataset(records, 16, data_cfg, skip=True)[0]  # the next record takes its place
    assert decode(replaced["tokens"].tolist()).startswith("<IMG>\na red box|")


def corrupt_png_body(path: Path) -> None:
    """Scramble the compressed pixels of a PNG but keep every chunk checksum right: Pillow's verify
    (used when the dataset is built) passes, decoding fails."""
    import struct
    import zlib

    raw = bytearray(path.read_bytes())
    start = raw.index(b"IDAT") - 4
    (length,) = struct.unpack(">I", raw[start:start + 4])
    body = start + 8
    raw[body + 2:body + length] = bytes(length - 2)  # after the zlib header: zeros are not a valid stream
    crc = zlib.crc32(bytes(raw[start + 4:body + length])) & 0xFFFFFFFF
    raw[body + length:body + length + 4] = struct.pack(">I", crc)
    path.write_bytes(bytes(raw))


def test_decode_failure_in_a_dataloader_worker_is_one_line(folder, data_cfg):
    """The training loop reads samples in DataLoader workers, which re-raise an error in the main process
    wrapped in a traceback; ``MMDataError.line`` (what pretrain_mm.py reports) is the original line."""
    png(folder / "scrambled.png", size=(32, 32))
    corrupt_png_body(folder / "scrambled.png")
    data = folder / "data.jsonl"
    data.write_text(json.dumps({"image": "scrambled.png", "caption": "x"}) + "\n")
    records, _ = read_records(str(data), str(folder), False)  # passes the check made at build time
    loader = torch.utils.data.DataLoader(dataset(records, 8, data_cfg), batch_size=2, num_workers=1)
    with pytest.raises(MMDataError) as err:
        next(iter(loader))
    assert str(err.value).startswith("Caught MMDataError in DataLoader worker process 0"), err.value
    assert err.value.line.startswith("data.jsonl:1: image scrambled.png: cannot decode ("), err.value.line
    assert "\n" not in err.value.line


def test_epochs_visit_every_record_in_a_new_order(folder, data_cfg):
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps({"image": "good.png", "caption": f"c{i}"}) + "\n" for i in range(5)))
    records, _ = read_records(str(data), str(folder), False)
    ds = dataset(records, 8, data_cfg, samples=10)
    epochs = [[ds.record_index(i) for i in range(e * 5, e * 5 + 5)] for e in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(5)) and epochs[0] != epochs[1]


# ------------------------------------------------------------------------------------------- images
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P"])
def test_image_is_rgb_resized_and_normalized(tmp_path, mode):
    path = png(tmp_path / "solid.png", colour=(255, 0, 0), size=(20, 10), mode=mode)
    mean, std = (0.5, 0.25, 0.125), (0.5, 0.25, 0.2)
    x = load_image(str(path), 8, mean, std, "bicubic")
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32
    from PIL import Image

    rgb = Image.open(path).convert("RGB").getpixel((0, 0))  # a solid image stays solid when resized
    expected = torch.tensor([(c / 255 - m) / s for c, m, s in zip(rgb, mean, std)]).view(3, 1, 1)
    assert torch.allclose(x, expected.expand(3, 8, 8), atol=1e-6)


def test_vision_checkpoint_must_agree_with_model_json(tmp_path):
    from adaptor.convert import ConversionError
    from adaptor.mm.weights import vision_tower_tensors
    from helpers.hf_fixtures import make_tiny_vision_tower

    tower = make_tiny_vision_tower(tmp_path / "clip", "clip", layers=2)
    vision = load_model_config(ROOT / "examples" / "vlm" / "model.json").vision  # hidden 64, ffn 256
    with pytest.raises(ConversionError, match=r"vision_encoder ffn_hidden_size is 256 but config.json says 128"):
        list(vision_tower_tensors(str(tower), vision, 1, 0))
    with pytest.raises(ConversionError, match=r"not a siglip vision model"):
        list(vision_tower_tensors(str(tower), {**vision, "model_id": "siglip"}, 1, 0))
    with pytest.raises(ConversionError, match=r"the tower has 3 layers but the checkpoint only 2"):
        list(vision_tower_tensors(str(tower), {**vision, "ffn_hidden_size": 128, "num_layers": 3}, 1, 0))


# ------------------------------------------------------------------------------------ layouts
def layout_args(**kw):
    base = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                sequence_parallel=False, hidden_size=128, seq_length=48)
    return argparse.Namespace(**{**base, **kw})


LAYOUT_CASES = {
    "pipeline": (dict(pipeline_model_parallel_size=2), {}, "--pipeline-model-parallel-size > 1 is not supported"),
    "context": (dict(context_parallel_size=2), {}, "--context-parallel-size > 1 is not supported"),
    "sequence parallel": (dict(sequence_parallel=True), {}, "--sequence-parallel is not supported"),
    "vision heads": (dict(tensor_model_parallel_size=8), {},
                     "image_encoder.vision_encoder.num_attention_heads 4 is not divisible by "
                     "--tensor-model-parallel-size 8"),
    "projector width": (dict(tensor_model_parallel_size=3), {"image_encoder.vision_encoder.num_attention_heads": 6,
                                                             "image_encoder.vision_encoder.hidden_size": 96,
                                                             "image_encoder.vision_encoder.ffn_hidden_size": 96},
                        "image_encoder.vision_projector.ffn_hidden_size 128 is not divisible by "
                        "--tensor-model-parallel-size 3"),
    "no room for text": (dict(seq_length=16), {}, "--seq-length 16 leaves no room for text: one image takes 16"),
}


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_layouts_pretrain_mm_cannot_run(case, tmp_path):
    from adaptor.features import ArgumentError
    from patches.multimodal.mm_arguments import check_layout

    flags, model_edits, expected = LAYOUT_CASES[case]
    model = EXAMPLE_MODEL
    for key, value in model_edits.items():
        model = edited(model, key, value)
    cfg = load_model_config(write(tmp_path / "model.json", model))
    data = load_data_config(ROOT / "examples" / "vlm" / "data.json")
    with pytest.raises(ArgumentError) as err:
        check_layout(layout_args(**flags), cfg, data)
    assert expected in str(err.value), err.value
    check_layout(layout_args(seq_length=17), load_model_config(ROOT / "examples" / "vlm" / "model.json"), data)


def test_text_decoder_from_hf_dir_equals_converted_checkpoint(tmp_path, tiny_hf):
    """text_decoder.ckpt_path as a HF Qwen3 directory (split on the fly) gives each TP rank exactly the
    tensors tools/convert_ckpt.py writes for it; mismatches are named."""
    from adaptor.convert import ConversionError, Layout, convert_hf_to_megatron
    from adaptor.convert.config_check import megatron_namespace, model_flags
    from adaptor.mm.weights import text_decoder_tensors

    hf_dir = tiny_hf["qwen3_vocab1436"]  # make_tiny_qwen3(vocab_size=1436), shared read-only
    config = json.loads((hf_dir / "config.json").read_text())
    converted = convert_hf_to_megatron(hf_dir, tmp_path / "mg_tp2", "qwen3", Layout(tp=2), save_format="torch")
    args, _, _ = megatron_namespace(model_flags("qwen3", config) + ["--tensor-model-parallel-size", "2"])
    args.padded_vocab_size = 1536  # 1436 padded to a multiple of 128 x TP, as Megatron and the converter pad
    for rank in (0, 1):
        online = dict(text_decoder_tensors(str(hf_dir), args, rank))
        offline = {k: v for k, v in text_decoder_tensors(str(converted), args, rank) if torch.is_tensor(v)}
        assert sorted(online) == sorted(offline) and len(online) == 34
        assert all(torch.equal(online[k], offline[k]) for k in online)
    args.num_layers = 3
    with pytest.raises(ConversionError, match=r"does not describe this decoder: --num-layers is 3 on the command "
                                              r"line but 4 in the Hugging Face config"):
        list(text_decoder_tensors(str(hf_dir), args, 0))
    args.num_layers, args.tensor_model_parallel_size = 4, 1
    with pytest.raises(ConversionError, match=r"converted for TP=2 PP=1; this run has TP=1"):
        list(text_decoder_tensors(str(converted), args, 0))
    args.padded_vocab_size = 1280
    with pytest.raises(ConversionError, match=r"vocab_size 1436 in config.json is more than the model's 1280 rows"):
        list(text_decoder_tensors(str(hf_dir), args, 0))
