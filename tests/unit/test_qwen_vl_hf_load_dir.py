"""``pretrain_mm.py --hf-load-dir DIR`` for a Qwen-VL model.json, checked before anything is built.

The directory is a config.json written from a model.json's shape keys (the config a checkpoint of that
model carries) and one safetensors file. (The e2e run in tests/e2e/test_pretrain_qwen_vl.py proves the
flag trains the exact loss curve of ``init_from_hf_path``.)

* A model.json without ``init_from_hf_path`` read with ``--hf-load-dir DIR`` describes the model by
  DIR/config.json, exactly as the same file naming DIR as ``init_from_hf_path`` does, and records where the
  directory came from; both naming the same directory (one relative, one absolute) is that model too.
* One line each: both naming different directories (both named), a shape key of model.json that DIR's
  config.json contradicts, ``--pretrained-checkpoint`` beside the flag, a directory without safetensors,
  and a llava model.json (no single Hugging Face directory).
* The weights: ``init_from_hf_path`` is always read; ``--hf-load-dir`` is read unless ``--load`` holds a
  checkpoint, which the run resumes from, as for GPT models.
"""
from __future__ import annotations

import json
import os
from argparse import Namespace

import pytest

from adaptor.features import ArgumentError
from adaptor.mm.config import MMConfigError, load_model_config, run_model_config

SECTIONS = {"image_encoder": {"vision_encoder": {"model_id": "qwen2vit"}, "vision_projector": {"model_id": "lnmlp"}},
            "text_decoder": {"model_id": "qwen2_5_lm"}}
SHAPES = {"image_encoder": {"vision_encoder": {"model_id": "qwen2vit", "num_layers": 2, "hidden_size": 32,
                                              "ffn_hidden_size": 48, "num_attention_heads": 2,
                                              "window_size": 56, "fullatt_block_indexes": [1]},
                            "vision_projector": {"model_id": "lnmlp"}},
          "text_decoder": {"model_id": "qwen2_5_lm", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96,
                           "num_attention_heads": 4, "num_query_groups": 2, "vocab_size": 320,
                           "mrope_section": [2, 3, 3]}}


def write(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A Hugging Face directory (config.json of a tiny Qwen2.5-VL, one tensor) and model.json files around it."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("hf_load_dir")
    shapes = write(root / "shapes.json", {"model_id": "qwen2_5vl", "img_context_token_id": 300, **SHAPES})
    hf = root / "hf"
    hf.mkdir()
    write(hf / "config.json", load_model_config(shapes).hf_config)
    save_file({"lm_head.weight": torch.zeros(2, 2)}, str(hf / "model.safetensors"))
    (root / "empty").mkdir()
    write(root / "empty" / "config.json", json.loads((hf / "config.json").read_text()))
    return root, hf


def one_line(info) -> str:
    assert "\n" not in str(info.value)
    return str(info.value)


def test_flag_reads_the_directory_as_init_from_hf_path(work):
    root, hf = work
    bare = write(root / "bare.json", {"model_id": "qwen2_5vl", **SECTIONS})
    named = write(root / "named.json", {"model_id": "qwen2_5vl", "init_from_hf_path": "hf", **SECTIONS})
    from_flag = run_model_config(Namespace(mm_model=bare, hf_load_dir=str(hf)))
    from_json = load_model_config(named)
    assert from_flag.hf_config == from_json.hf_config == json.loads((hf / "config.json").read_text())
    assert from_flag.text == from_json.text and from_flag.text["num_layers"] == 2
    assert (from_flag.init_from_hf_path, from_flag.hf_dir_source) == (str(hf), "--hf-load-dir")
    assert from_json.hf_dir_source == "init_from_hf_path"
    with pytest.raises(MMConfigError, match="missing"):  # without the flag the file describes nothing
        run_model_config(Namespace(mm_model=bare, hf_load_dir=None))

    cwd = os.getcwd()
    os.chdir(root)
    try:  # the same directory, relative on the command line and absolute in model.json: one model
        both = run_model_config(Namespace(mm_model=named, hf_load_dir="./hf/"))
    finally:
        os.chdir(cwd)
    assert both.hf_config == from_json.hf_config and both.hf_dir_source == "init_from_hf_path"


def test_disagreements_are_one_line(work):
    root, hf = work
    named = write(root / "named_empty.json", {"model_id": "qwen2_5vl", "init_from_hf_path": "empty", **SECTIONS})
    with pytest.raises(MMConfigError) as info:
        load_model_config(named, str(hf))
    assert one_line(info) == (f"{named}: init_from_hf_path {root / 'empty'} and --hf-load-dir {hf} name different "
                              f"directories; give one")

    deeper = {**SECTIONS, "text_decoder": {"model_id": "qwen2_5_lm", "num_layers": 3}}
    wrong = write(root / "wrong.json", {"model_id": "qwen2_5vl", **deeper})
    with pytest.raises(MMConfigError) as info:
        load_model_config(wrong, str(hf))
    assert one_line(info) == f"{wrong}: text_decoder.num_layers is 3 but {hf}/config.json says 2"

    qwen3 = write(root / "qwen3.json", {"model_id": "qwen3vl", "image_encoder": {
        "vision_encoder": {"model_id": "qwen3vit"}, "vision_projector": {"model_id": "lnmlp"}},
        "text_decoder": {"model_id": "qwen3lm"}})
    with pytest.raises(MMConfigError) as info:
        load_model_config(qwen3, str(hf))
    assert one_line(info) == (f"--hf-load-dir {hf}: {hf}/config.json has model_type 'qwen2_5_vl'; this model.json "
                              f"builds qwen3_vl")


def test_flag_refusals_are_one_line(work):
    from patches.multimodal.qwen_vl_hf_save import check_hf_flags

    root, hf = work
    bare = write(root / "bare.json", {"model_id": "qwen2_5vl", **SECTIONS})

    def check(**flags):
        args = Namespace(mm_model=bare, hf_save_dir=None, pretrained_checkpoint=None, **flags)
        check_hf_flags(args, run_model_config(args))

    check(hf_load_dir=str(hf))  # the directory has config.json and weights: accepted
    cases = [({"hf_load_dir": str(hf), "pretrained_checkpoint": str(root)},
              "--hf-load-dir and --pretrained-checkpoint both give initial weights; pass one"),
             ({"hf_load_dir": str(root / "empty")}, f"--hf-load-dir {root / 'empty'}: ")]
    for flags, message in cases:
        args = Namespace(mm_model=bare, hf_save_dir=None, **{"pretrained_checkpoint": None, **flags})
        with pytest.raises(ArgumentError) as info:
            check_hf_flags(args, run_model_config(args))
        assert one_line(info).startswith(message), str(info.value)
    assert "safetensors" in str(info.value)

    llava = write(root / "llava.json", {"model_id": "llava", "image_encoder": {
        "vision_encoder": {"model_id": "clip", "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64,
                           "num_attention_heads": 2, "patch_size": 14, "image_size": 28},
        "vision_projector": {"model_id": "mlp"}},
        "text_decoder": {"model_id": "qwen3", "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64,
                         "num_attention_heads": 2}})
    args = Namespace(mm_model=llava, hf_load_dir=str(hf), hf_save_dir=None)
    with pytest.raises(ArgumentError) as info:
        check_hf_flags(args, run_model_config(args))
    assert one_line(info) == ("pretrain_mm.py: a llava model.json has no single Hugging Face directory; give the "
                              "decoder's and the tower's as text_decoder.ckpt_path and "
                              "image_encoder.vision_encoder.ckpt_path instead of --hf-load-dir")


def test_a_load_checkpoint_wins_over_the_flag_only(work, capsys):
    from adaptor.mm.qwen_vl.steps import hf_weights_to_load

    root, hf = work
    bare = write(root / "bare.json", {"model_id": "qwen2_5vl", **SECTIONS})
    named = write(root / "named.json", {"model_id": "qwen2_5vl", "init_from_hf_path": "hf", **SECTIONS})
    from_flag, from_json = load_model_config(bare, str(hf)), load_model_config(named)
    assert hf_weights_to_load(from_flag, None, False) == str(hf)
    assert hf_weights_to_load(from_json, "ckpt", True) == str(hf)
    capsys.readouterr()
    assert hf_weights_to_load(from_flag, "ckpt", True) is None
    out = capsys.readouterr()
    assert "--load ckpt has a checkpoint: resuming from it, not from --hf-load-dir" in out.out + out.err
