"""model.json against data.json before a Qwen-VL model is built, and MindSpeed-MM's ``999999`` placeholders.

* The example tokenizer with Qwen-VL's vision tokens (tools/make_sample_vl_data.py) and a model.json whose
  ``img_context_token_id`` / ``vision_start_token_id`` / ``video_token_id`` are its ids pass pretrain_mm.py's
  file checks; one id off, or a vocab_size below the tokenizer's size, is one line naming both files, both
  values and the token, from data.json's tokenizer and from ``--tokenizer-model``.
* MindSpeed-MM's published Qwen3-VL model.json (examples/qwen3vl/model_8B.json: ``999999`` for the towers'
  and decoder's num_layers, hidden_size, num_attention_heads, the projector's num_layers and the decoder's
  max_position_embeddings), pointed at a tiny transformers Qwen3-VL directory, loads: the placeholders take
  config.json's values and are listed (the start prints them in one line), and the built model takes every
  tensor of that checkpoint, holding as many numbers as it. Without ``init_from_hf_path`` a placeholder is
  one line.
* That file's ``patch`` section (``clip_grad_async: true``, ``scale_grad: true``) loads: the start prints one
  line for the speed switch clip_grad_async and none for scale_grad (adaptor.fsdp2's wrapper scales its
  gradients when Megatron asks). Each switch MindSpeed-MM has that would change training here (an adaptive
  clipping rule, FSDP1, weights from a .pt file or through Megatron-Bridge, layer-wise disaggregation) is one
  line naming ``patch.<key>``; false switches nothing; a key MindSpeed-MM does not know is one line.
"""
from __future__ import annotations

import json
from argparse import Namespace
from types import SimpleNamespace

import pytest

from helpers.hf_fixtures import VL_TEXT, make_tiny_qwen3_vl
from helpers.processes import import_tool

from adaptor.features import ArgumentError
from adaptor.mm.config import MMConfigError, load_model_config
from adaptor.mm.qwen_vl.data_config import load_qwen_vl_data_config

FROM_HF = 999999


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tokenizers import Tokenizer

    sample_data = import_tool("make_sample_vl_data")
    out = sample_data.add_vision_tokens(sample_data.BASE_TOKENIZER, tmp_path_factory.mktemp("tok") / "tokenizer")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in ("<|image_pad|>", "<|vision_start|>", "<|video_pad|>")}
    return out, ids, tok.get_vocab_size(with_added_tokens=True)


def keys_model_json(folder, ids, vocab, **top) -> str:
    """A Qwen2.5-VL model.json built from its keys (no init_from_hf_path)."""
    doc = {"model_id": "qwen2_5vl", "img_context_token_id": ids["<|image_pad|>"],
           "vision_start_token_id": ids["<|vision_start|>"], "video_token_id": ids["<|video_pad|>"], **top,
           "image_encoder": {"vision_encoder": {"model_id": "qwen2vit", "num_layers": 2, "hidden_size": 32,
                                                "ffn_hidden_size": 48, "num_attention_heads": 2,
                                                "window_size": 56, "fullatt_block_indexes": [1]},
                             "vision_projector": {"model_id": "lnmlp"}},
           "text_decoder": {"model_id": "qwen2_5_lm", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96,
                            "num_attention_heads": 4, "num_query_groups": 2, "vocab_size": vocab,
                            "mrope_section": [2, 3, 3]}}
    file = folder / f"model_{len(list(folder.iterdir()))}.json"
    file.write_text(json.dumps(doc))
    return str(file)


def data_json(folder) -> str:
    (folder / "records.json").write_text("[]")
    doc = {"dataset_param": {"dataset_type": "huggingface",
                             "preprocess_parameters": {"model_name_or_path": "tokenizer"},
                             "basic_parameters": {"template": "qwen2vl", "dataset_dir": ".",
                                                  "dataset": "records.json"}},
           "dataloader_param": {}}
    (folder / "data.json").write_text(json.dumps(doc))
    return str(folder / "data.json")


def one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text
    return text


def test_vision_token_ids_and_vocabulary_agree_with_the_tokenizer(tokenizer_dir):
    from patches.multimodal.mm_arguments import check_files, check_tokenizer_model

    tok_dir, ids, size = tokenizer_dir
    folder = tok_dir.parent
    data_cfg = load_qwen_vl_data_config(data_json(folder))

    good = load_model_config(keys_model_json(folder, ids, size))
    check_files(good, data_cfg)  # the matching pair passes
    check_tokenizer_model(Namespace(tokenizer_model=str(tok_dir)), good)

    off = ids["<|image_pad|>"] - 1
    model_file = keys_model_json(folder, ids, size, img_context_token_id=off)
    bad = load_model_config(model_file)
    with pytest.raises(ArgumentError) as info:
        check_files(bad, data_cfg)
    assert one_line(info) == (
        f"{model_file}: img_context_token_id has image_token_id {off} but the tokenizer of {data_cfg.file}: "
        f"dataset_param.preprocess_parameters.model_name_or_path ({tok_dir}) gives <|image_pad|> id "
        f"{ids['<|image_pad|>']}; the two must agree")
    with pytest.raises(ArgumentError, match=rf"--tokenizer-model {tok_dir} gives <\|image_pad\|> id"):
        check_tokenizer_model(Namespace(tokenizer_model=str(tok_dir)), bad)

    start = keys_model_json(folder, ids, size, vision_start_token_id=ids["<|vision_start|>"] + 5)
    with pytest.raises(ArgumentError, match=r"vision_start_token_id .* gives <\|vision_start\|> id "):
        check_files(load_model_config(start), data_cfg)

    small = keys_model_json(folder, ids, size - 1)
    with pytest.raises(ArgumentError) as info:
        check_files(load_model_config(small), data_cfg)
    assert one_line(info).endswith(f"has {size} tokens but {small}'s model has vocab_size {size - 1}; "
                                   f"ids past {size - 2} have no embedding")


def mindspeed_qwen3vl_json(folder, hf_dir) -> str:
    """examples/qwen3vl/model_8B.json of MindSpeed-MM, its placeholders and its ``patch`` section as published."""
    doc = {"model_id": "qwen3_vl", "init_from_hf_path": str(hf_dir),
           "image_encoder": {
               "vision_encoder": {"model_id": "qwen3vit", "num_layers": FROM_HF, "hidden_size": FROM_HF,
                                  "num_attention_heads": FROM_HF, "freeze": True},
               "vision_projector": {"model_id": "lnmlp", "num_layers": FROM_HF, "freeze": True}},
           "text_decoder": {"model_id": "qwen3lm", "num_layers": FROM_HF, "hidden_size": FROM_HF,
                            "num_attention_heads": FROM_HF, "max_position_embeddings": FROM_HF, "freeze": False},
           "patch": {"clip_grad_async": True, "scale_grad": True}}
    if hf_dir is None:
        del doc["init_from_hf_path"]
    file = folder / f"model_8B_{hf_dir is None}.json"
    file.write_text(json.dumps(doc))
    return str(file)


def test_mindspeed_placeholders_take_config_json(tmp_path, model_parallel, capsys):
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from adaptor.convert import HfCheckpoint, Layout
    from adaptor.mm.qwen_vl.checkpoint import load_hf_into
    from adaptor.mm.qwen_vl.decoder import decoder_transformer_config
    from adaptor.mm.qwen_vl.model import QwenVLModel
    from adaptor.mm.qwen_vl.model_json import text_config, vision_settings

    hf_dir = make_tiny_qwen3_vl(tmp_path / "hf")
    cfg = load_model_config(mindspeed_qwen3vl_json(tmp_path, hf_dir))
    assert cfg.taken_from_hf == (
        "image_encoder.vision_encoder.num_layers", "image_encoder.vision_encoder.hidden_size",
        "image_encoder.vision_encoder.num_attention_heads", "image_encoder.vision_projector.num_layers",
        "text_decoder.num_layers", "text_decoder.hidden_size", "text_decoder.num_attention_heads",
        "text_decoder.max_position_embeddings")
    text, settings = text_config(cfg), vision_settings(cfg)
    assert (settings.depth, settings.hidden_size, settings.num_heads) == (2, 32, 2)
    assert {k: cfg.text[k] for k in ("num_layers", "hidden_size", "num_attention_heads",
                                     "max_position_embeddings")} == {
        "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "max_position_embeddings": VL_TEXT["max_position_embeddings"]}
    assert (cfg.vision["freeze"], cfg.projector["freeze"], cfg.text["freeze"]) == (True, True, False)
    # model_id "qwen3_vl" (that file's spelling) feeds the data pipeline Qwen3-VL's processor and positions
    from adaptor.mm.qwen_vl.dataset import family_of

    assert family_of(cfg, load_qwen_vl_data_config(data_json(tmp_path))) == "qwen3_vl"

    model_parallel_cuda_manual_seed(1)
    model = QwenVLModel(settings, text, decoder_transformer_config(text, use_cpu_initialization=True),
                        image_token_id=cfg.hf_config["image_token_id"], vocab_size=text.vocab_size)
    checkpoint = HfCheckpoint(hf_dir)
    loaded = load_hf_into(model, checkpoint, Layout(), 0, 0)
    assert loaded == len([n for n in model.state_dict() if not n.endswith("_extra_state")])
    # the fused q/k/v and gate/up hold the same numbers as the checkpoint's separate tensors
    assert sum(p.numel() for p in model.parameters()) == sum(checkpoint.get(n).numel() for n in checkpoint.names())

    # the start prints the keys config.json filled, once
    from patches.multimodal.mm_arguments import MultimodalArguments

    args = Namespace(mm_model=str(cfg.file), mm_data=data_json(tmp_path), tensor_model_parallel_size=1)
    MultimodalArguments().set_defaults(args, SimpleNamespace(explicit=set()))
    out = capsys.readouterr().out.splitlines()
    printed = [line for line in out if "999999" in line]
    assert printed == [f"[megatron-adaptor] {cfg.file}: {', '.join(cfg.taken_from_hf)} = 999999 taken from "
                       f"{hf_dir}/config.json"]
    patch_lines = [line for line in out if ": patch." in line]
    assert patch_lines == [f"[megatron-adaptor] {cfg.file}: patch.clip_grad_async: MindSpeed-MM keeps the gradient "
                           f"norm and clipping factor on the device (a speed switch); Megatron's clipping here gives "
                           f"the same gradients, with one host synchronisation per step"], out
    assert args.num_layers == 2 and args.hidden_size == 64 and args.max_position_embeddings == 4096

    file = mindspeed_qwen3vl_json(tmp_path, None)
    with pytest.raises(MMConfigError) as info:
        load_model_config(file)
    assert one_line(info) == (
        f"{file}: image_encoder.vision_encoder.num_layers is 999999, which means \"take it from "
        f"init_from_hf_path's config.json\", but no init_from_hf_path is given")


@pytest.mark.parametrize("key,value,says", [
    ("adaptive_clip_grad_norm", {"clip_grad_ema_decay": 0.99}, "the moving-average clipping threshold is not "
                                                               "implemented; drop it and clip with --clip-grad"),
    ("use_fsdp1", True, "FSDP1 is not provided; drop it and shard with --use-torch-fsdp2"),
    ("get_dist_model_load_from_pt", True, "weights are not read from a .pt file at model build; drop it and start "
                                          "from init_from_hf_path or --load"),
    ("bridge_patch", True, "--load is not read as a Hugging Face directory; drop it and name the directory in "
                           "init_from_hf_path"),
    ("layerwise_disaggregated_training", True, "layer-wise disaggregated training is not provided; drop it"),
    ("clip_grad_asinc", True, "unknown switch (MindSpeed-MM's: scale_grad, clip_grad_async, infer_fa, ae_float32, "
                              "muon_optimizer, adaptive_clip_grad_norm, use_fsdp1, get_dist_model_load_from_pt, "
                              "bridge_patch, layerwise_disaggregated_training)"),
])
def test_patch_switches_that_would_change_training_are_one_line(tokenizer_dir, key, value, says):
    tok_dir, ids, size = tokenizer_dir
    file = keys_model_json(tok_dir.parent, ids, size, patch={"scale_grad": True, key: value})
    with pytest.raises(MMConfigError) as info:
        load_model_config(file)
    assert one_line(info) == f"{file}: patch.{key}: {says}"
    if key != "clip_grad_asinc":  # false switches nothing, as in MindSpeed-MM
        off = load_model_config(keys_model_json(tok_dir.parent, ids, size, patch={key: False, "infer_fa": True}))
        assert off.patch_notices == (f"{off.file}: patch.infer_fa: an inference-time attention kernel; training "
                                     f"runs the attention --attention-backend picks",)
