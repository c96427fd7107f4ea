"""The whole Qwen2.5-VL / Qwen3-VL model (adaptor.mm.qwen_vl.model) against transformers, in this process, fp32.

Tiny random ``Qwen2_5_VLForConditionalGeneration`` (tied output layer, a windowed and a full vision block) and
``Qwen3VLForConditionalGeneration`` (untied, deepstack after decoder layer 0) from tests/helpers/hf_fixtures.py,
described by a model.json that names only ``init_from_hf_path`` and a few agreeing keys. A batch of two
samples, the first with two images of different sizes (2x2 and 4x6 patches), the second with one (4x4):

* our :class:`QwenVLModel`, loaded through :func:`adaptor.mm.qwen_vl.checkpoint.load_hf_into`, fed the pixel
  values, grids and transformers' own 3-D positions, gives transformers' logits within 1e-4 (measured
  6e-7 and 1.3e-6, logits up to 1.6); with labels, the per-token loss is the cross entropy of those logits,
  also when the batch went through pretrain_mm.py's TP broadcast (and a batch without images passes);
* Hugging Face -> our ranks -> Hugging Face is bit-exact at TP1 (the built model's own state) and at TP2 x PP2
  (every rank's tensors cut from the checkpoint, saved as a checkpoint's rank files, written back by
  tools/qwen_vl_to_hf.py), under the checkpoint's own names;
* model.json: a key not built here, a shape that disagrees with config.json, a fixed key with another value
  are one line each naming the JSON path; a pipeline split that puts Qwen3-VL's deepstack layers past the
  first stage, context parallelism and a LLaVA data.json are one line each.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.hf_fixtures import VL_IMAGE_TOKEN, VL_VISION_START, make_tiny_qwen2_5_vl, make_tiny_qwen3_vl

ROOT = Path(__file__).resolve().parents[2]
GRIDS = torch.tensor([[1, 2, 2], [1, 4, 6], [1, 4, 4]])  # merged 2x2: 1, 6 and 4 image tokens


def batch_ids() -> torch.Tensor:
    def image(tokens):
        return [VL_VISION_START] + [VL_IMAGE_TOKEN] * tokens

    first = [3, 4] + image(1) + [5, 6, 7] + image(6) + [8, 9]
    second = [10, 11, 12] + image(4) + [13] * (len(first) - 8)
    return torch.tensor([first, second])


@pytest.fixture(scope="module")
def families(tmp_path_factory, model_parallel):
    from transformers import AutoModelForImageTextToText

    out = {}
    for family, make in (("qwen2_5_vl", make_tiny_qwen2_5_vl), ("qwen3_vl", make_tiny_qwen3_vl)):
        path = make(tmp_path_factory.mktemp(family) / "hf")
        hf = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        out[family] = (path, hf.eval())
    return out


def model_json(tmp_path, family, hf_dir, **extra) -> str:
    ids = {"qwen2_5_vl": ("qwen2_5vl", "qwen2vit", "qwen2_5_lm"), "qwen3_vl": ("qwen3vl", "qwen3vit", "qwen3lm")}
    model_id, vision_id, text_id = ids[family]
    doc = {"model_id": model_id, "init_from_hf_path": str(hf_dir), "img_context_token_id": VL_IMAGE_TOKEN,
           "image_encoder": {"vision_encoder": {"model_id": vision_id, "num_layers": 2, "freeze": True},
                             "vision_projector": {"model_id": "lnmlp"}},
           "text_decoder": {"model_id": text_id, "hidden_size": 64, "mrope_section": [2, 3, 3],
                            "normalization": "RMSNorm"}}
    for path, value in extra.items():
        *parents, key = path.split("__")
        node = doc
        for p in parents:
            node = node[p]
        node[key] = value
    file = tmp_path / f"{family}_{len(list(tmp_path.iterdir()))}.json"
    file.write_text(json.dumps(doc))
    return str(file)


def run_tool(name: str, *argv) -> str:
    """A tools/ script's main() in this process; what it printed."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location(name[:-3], ROOT / "tools" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert module.main([str(a) for a in argv]) == 0
    return out.getvalue()


def build(model_cfg):
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from adaptor.mm.qwen_vl.decoder import decoder_transformer_config
    from adaptor.mm.qwen_vl.model import QwenVLModel
    from adaptor.mm.qwen_vl.model_json import text_config, vision_settings

    model_parallel_cuda_manual_seed(1)
    text = text_config(model_cfg)
    model = QwenVLModel(vision_settings(model_cfg), text, decoder_transformer_config(text, use_cpu_initialization=True),
                        image_token_id=model_cfg.hf_config["image_token_id"], vocab_size=text.vocab_size)
    model.freeze(model_cfg.vision["freeze"], model_cfg.projector["freeze"], model_cfg.text["freeze"])
    return model.eval()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_whole_model_logits_loss_and_weights_round_trip(families, tmp_path, family):
    from adaptor.convert import HfCheckpoint, Layout
    from adaptor.mm.config import load_model_config
    from adaptor.mm.qwen_vl.checkpoint import hf_state, load_hf_into, rank_tensors
    from adaptor.mm.qwen_vl.rope_index import token_types

    path, hf = families[family]
    model_cfg = load_model_config(model_json(tmp_path, family, path))
    model = build(model_cfg)
    checkpoint = HfCheckpoint(path)
    loaded = load_hf_into(model, checkpoint, Layout(), 0, 0)
    assert loaded == len([n for n in model.state_dict() if not n.endswith("_extra_state")])
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith("vision_model.") and "merger" not in n for n in frozen)

    settings = model.settings
    ids = batch_ids()
    torch.manual_seed(3)
    pixels = torch.randn(int(GRIDS.prod(-1).sum()), settings.patch_dim)
    types = token_types(ids, VL_IMAGE_TOKEN)
    positions, _ = hf.model.get_rope_index(ids, types, image_grid_thw=GRIDS)
    with torch.no_grad():
        want = hf(input_ids=ids, pixel_values=pixels, image_grid_thw=GRIDS, mm_token_type_ids=types).logits
        got = model(ids, positions, pixels, GRIDS)
        error = (got - want).abs().max().item()
        assert got.shape == want.shape and error < 1e-4, error
        print(f"{family}: max abs logit difference {error:.1e} (max |logit| {want.abs().max():.2f})")
        labels = torch.roll(ids, -1, dims=1)
        loss = model(ids, positions, pixels, GRIDS, labels=labels)
        expected = torch.nn.functional.cross_entropy(got.flatten(0, 1), labels.flatten(), reduction="none")
        assert torch.allclose(loss.flatten(), expected, atol=1e-5)
        # The micro-batch as the data pipeline hands it over, through the TP broadcast (sizes first: a batch
        # without images has no patch rows), into the forward step's call.
        from adaptor.mm.qwen_vl.steps import broadcast_batch

        batch = {"tokens": ids, "labels": labels, "loss_mask": torch.ones(ids.shape), "position_ids": positions,
                 "pixel_values": pixels, "image_grid_thw": GRIDS}
        sent = broadcast_batch(batch)
        assert all(torch.equal(sent[k].cpu(), v) for k, v in batch.items())
        assert torch.equal(model(sent["tokens"], sent["position_ids"], sent["pixel_values"], sent["image_grid_thw"],
                                 labels=sent["labels"], loss_mask=sent["loss_mask"]), loss)
        text_only = {**batch, "tokens": torch.full_like(ids, 5), "pixel_values": pixels[:0],
                     "image_grid_thw": GRIDS[:0]}
        sent = broadcast_batch(text_only)
        assert sent["pixel_values"].shape == (0, settings.patch_dim) and sent["image_grid_thw"].shape == (0, 3)
        model(sent["tokens"], sent["position_ids"], sent["pixel_values"], sent["image_grid_thw"])
        # The images count: other pixels move the logits of the tokens after them.
        assert (model(ids, positions, pixels + 1.0, GRIDS) - got).abs().max() > 1e-3

    # Hugging Face -> ours -> Hugging Face, bit for bit, under the checkpoint's names.
    original = {n: checkpoint.get(n) for n in checkpoint.names()}
    back = hf_state({(0, 0): model.state_dict()}, checkpoint.config, Layout(), padded_vocab_size=160, like=checkpoint)
    assert back.keys() == original.keys() and all(torch.equal(back[n], original[n]) for n in back)
    layout = Layout(tp=2, pp=2)
    ranks = {(t, p): dict(rank_tensors(checkpoint, layout, t, p, padded_vocab_size=160))
             for t in range(2) for p in range(2)}
    assert not any(n.startswith("vision_model.") for n in ranks[(0, 1)])  # the tower lives on the first stage
    qkv = "vision_model.layers.0.self_attention.linear_qkv.weight"
    assert ranks[(0, 0)][qkv].shape[0] * 2 == model.state_dict()[qkv].shape[0]
    # ... written as a pretrain_mm.py checkpoint's rank files, made a Hugging Face directory by the tool.
    step = tmp_path / "ckpt" / "iter_0000001"
    for (t, p), state in ranks.items():
        (step / f"mp_rank_{t:02d}_{p:03d}").mkdir(parents=True)
        torch.save({"model": state}, step / f"mp_rank_{t:02d}_{p:03d}" / "model_optim_rng.pt")
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("1")
    tool = run_tool("qwen_vl_to_hf.py", "--load", tmp_path / "ckpt", "--mm-model", model_cfg.file,
                    "--save-dir", tmp_path / "out")
    assert "(TP 2, PP 2) written to" in tool
    written = HfCheckpoint(tmp_path / "out")
    assert set(written.names()) == original.keys()
    assert all(torch.equal(written.get(n), original[n]) for n in original)


def test_model_json_problems_are_one_line(families, tmp_path):
    from adaptor.mm.config import MMConfigError, load_model_config

    path, _ = families["qwen2_5_vl"]
    cases = [
        ({"image_encoder__vision_encoder__use_fused_rotary_pos_emb": True},
         r"image_encoder\.vision_encoder\.use_fused_rotary_pos_emb: unknown key \(known here: model_id, "),
        ({"text_decoder__num_layers": 3}, r"text_decoder\.num_layers is 3 but .*/config\.json says 2$"),
        ({"text_decoder__normalization": "LayerNorm"},
         r"text_decoder\.normalization is \"LayerNorm\"; qwen2_5vl has \"RMSNorm\" \(not configurable\)$"),
        ({"init_from_hf_path": None, "text_decoder__num_layers": 2},
         r"image_encoder\.vision_encoder\.hidden_size: missing \(needed without init_from_hf_path\)$"),
    ]
    for extra, message in cases:
        file = model_json(tmp_path, "qwen2_5_vl", path, **extra)
        if extra.get("init_from_hf_path", 1) is None:
            doc = json.loads(open(file).read())
            del doc["init_from_hf_path"]
            open(file, "w").write(json.dumps(doc))
        with pytest.raises(MMConfigError, match=message) as info:
            load_model_config(file)
        assert "\n" not in str(info.value) and str(info.value).startswith(file)


def test_layouts_the_model_cannot_run_are_one_line(tmp_path):
    """Qwen3-VL's deepstack layers must lie on the first pipeline stage; even pipeline splits (the weights are
    placed by one); no context parallelism."""
    from types import SimpleNamespace

    from adaptor.features import ArgumentError
    from adaptor.mm.config import load_model_config
    from patches.multimodal.mm_arguments import check_qwen_vl_layout

    doc = {"model_id": "qwen3vl", "img_context_token_id": 150,  # 3 deepstack layers of 4
           "image_encoder": {"vision_encoder": {"model_id": "qwen3vit", "num_layers": 4, "hidden_size": 32,
                                                "ffn_hidden_size": 48, "num_attention_heads": 2,
                                                "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 1, 2]},
                             "vision_projector": {"model_id": "lnmlp"}},
           "text_decoder": {"model_id": "qwen3lm", "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 96,
                            "num_attention_heads": 4, "vocab_size": 160, "kv_channels": 16, "mrope_section": [2, 3, 3]}}
    file = tmp_path / "qwen3vl.json"
    file.write_text(json.dumps(doc))
    model_cfg = load_model_config(file)

    def args(**kw):
        return SimpleNamespace(**{"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                  "context_parallel_size": 1, "sequence_parallel": False,
                                  "virtual_pipeline_model_parallel_size": None,
                                  "num_layers_per_virtual_pipeline_stage": None,
                                  "decoder_first_pipeline_num_layers": None,
                                  "decoder_last_pipeline_num_layers": None, **kw})

    check_qwen_vl_layout(args(tensor_model_parallel_size=2), model_cfg)
    with pytest.raises(ArgumentError, match="splits the decoder evenly over the pipeline stages; drop "
                                            "--decoder-first-pipeline-num-layers$"):
        check_qwen_vl_layout(args(pipeline_model_parallel_size=2, decoder_first_pipeline_num_layers=3), model_cfg)
    with pytest.raises(ArgumentError, match=r"qwen3vl adds deepstack features after decoder layers 1\.\.3, which "
                                            r"must lie on the first pipeline stage; it holds 2 at "
                                            r"--pipeline-model-parallel-size 2$"):
        check_qwen_vl_layout(args(pipeline_model_parallel_size=2), model_cfg)
    with pytest.raises(ArgumentError, match="--context-parallel-size > 1 and --sequence-parallel are not supported"):
        check_qwen_vl_layout(args(context_parallel_size=2), model_cfg)
    # The LLaVA records' data.json cannot feed it.
    from adaptor.mm.config import load_data_config
    from patches.multimodal.mm_arguments import check_files

    llava_data = load_data_config(ROOT / "examples" / "vlm" / "data.json")
    with pytest.raises(ArgumentError, match=r"data\.json: a multimodal data\.json feeds model_id llava; .*qwen3vl\.json "
                                            r"has model_id qwen3vl$"):
        check_files(model_cfg, llava_data)
