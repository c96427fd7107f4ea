"""check_hf_parity.py's Qwen2.5-VL / Qwen3-VL side: the batch with images, both models' logits.

The batch: random text ids and, per sample, images of fixed patch grids (the first sample two images of
different sizes, the next one image, and so on alternately) with random pixel values; the 3-D positions
are this project's :mod:`adaptor.mm.qwen_vl.rope_index` (the data pipeline's), while transformers computes
its own, so the positions are compared too. Megatron's side is
:class:`~adaptor.mm.qwen_vl.model.QwenVLModel` built and loaded as pretrain_mm.py builds it from a
model.json whose ``init_from_hf_path`` is the directory.
"""
from __future__ import annotations

import json
from pathlib import Path

VL_MODEL_TYPES = {"qwen2_5_vl": "qwen2_5vl", "qwen3_vl": "qwen3vl"}
SAMPLE_GRIDS = ([(1, 2, 2), (1, 4, 6)], [(1, 4, 4)])  # patches; merged 2x2: 1 and 6 tokens, 4 tokens


def write_model_json(hf_dir: str, work: str) -> str:
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    vision, text = {"qwen2_5_vl": ("qwen2vit", "qwen2_5_lm"), "qwen3_vl": ("qwen3vit", "qwen3lm")}[config["model_type"]]
    doc = {"model_id": VL_MODEL_TYPES[config["model_type"]], "init_from_hf_path": str(Path(hf_dir).resolve()),
           "image_encoder": {"vision_encoder": {"model_id": vision}, "vision_projector": {"model_id": "lnmlp"}},
           "text_decoder": {"model_id": text}}
    path = Path(work) / "model.json"
    path.write_text(json.dumps(doc))
    return str(path)


def decoder_flags(model_json: str) -> list[str]:
    """The decoder's Megatron flags, as pretrain_mm.py's model.json handling sets them; the M-RoPE sections
    and position type are left to the model builder, which takes them from config.json (on a command line
    those flags are refused: pretrain_gpt.py's batches carry no 3-D positions)."""
    from adaptor.mm.config import load_model_config

    t = load_model_config(model_json).text
    flags = ["--num-layers", t["num_layers"], "--hidden-size", t["hidden_size"], "--ffn-hidden-size",
             t["ffn_hidden_size"], "--num-attention-heads", t["num_attention_heads"], "--group-query-attention",
             "--num-query-groups", t["num_query_groups"], "--kv-channels", t["kv_channels"],
             "--normalization", "RMSNorm", "--norm-epsilon", t["layernorm_epsilon"], "--disable-bias-linear",
             "--swiglu", "--rotary-base", t["rotary_base"]]
    flags += ["--add-qkv-bias"] if t["add_qkv_bias"] else []
    flags += ["--qk-layernorm"] if t["qk_layernorm"] else []
    flags += ["--untie-embeddings-and-output-weights"] if t["untie_embeddings_and_output_weights"] else []
    return [str(f) for f in flags]


def make_batch(config: dict, batch: int, seq_len: int, generator) -> dict:
    """tokens [b, s], pixel_values, image_grid_thw, position_ids [3, b, s] (ours)."""
    import torch

    from adaptor.mm.qwen_vl.rope_index import qwen2_5_vl_rope_index, qwen3_vl_rope_index, token_types
    from adaptor.mm.qwen_vl.settings import VisionSettings

    vision = VisionSettings.from_hf(config["model_type"], config["vision_config"])
    image_id, start_id = int(config["image_token_id"]), config.get("vision_start_token_id")
    text_vocab = min(int(config.get("text_config", config).get("vocab_size", config.get("vocab_size"))), image_id)
    rows, grids = [], []
    for i in range(batch):
        sample = []
        for grid in SAMPLE_GRIDS[i % 2]:
            sample += torch.randint(0, text_vocab, (2,), generator=generator).tolist()
            sample += ([start_id] if start_id is not None else []) + [image_id] * (grid[1] * grid[2] // vision.merge_unit)
            grids.append(grid)
        if len(sample) > seq_len - 1:
            raise ValueError(f"--seq-len {seq_len} is too short for the images of a sample ({len(sample) + 1} tokens)")
        sample += torch.randint(0, text_vocab, (seq_len - len(sample),), generator=generator).tolist()
        rows.append(sample)
    tokens = torch.tensor(rows)
    grid_thw = torch.tensor(grids)
    pixels = torch.randn(int(grid_thw.prod(-1).sum()), vision.patch_dim, generator=generator)
    types = token_types(tokens, image_id)
    if config["model_type"] == "qwen3_vl":
        positions, _ = qwen3_vl_rope_index(types, grid_thw, spatial_merge_size=vision.spatial_merge_size)
    else:
        positions, _ = qwen2_5_vl_rope_index(types, grid_thw, spatial_merge_size=vision.spatial_merge_size)
    return {"tokens": tokens, "pixel_values": pixels, "image_grid_thw": grid_thw, "position_ids": positions}


def hf_logits(hf_dir: str, batch: dict):
    import torch
    from transformers import AutoModelForImageTextToText

    from adaptor.mm.qwen_vl.rope_index import token_types

    model = AutoModelForImageTextToText.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    types = token_types(batch["tokens"], model.config.image_token_id)
    with torch.no_grad():
        return model(input_ids=batch["tokens"], pixel_values=batch["pixel_values"],
                     image_grid_thw=batch["image_grid_thw"], mm_token_type_ids=types).logits.float()


def model_provider_for(model_json: str, args=None):
    """A Megatron model provider building and loading the model of ``model_json`` (pretrain_mm.py's way), from
    ``args`` (default: Megatron's global arguments)."""
    from adaptor.mm.config import load_model_config

    model_cfg = load_model_config(model_json)

    def provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
        from megatron.training import get_args
        from megatron.training.arguments import core_transformer_config_from_args

        from adaptor.mm.builders import builder

        model_args = args or get_args()
        parts = builder(model_cfg)
        model = parts.build_model(model_args, model_cfg, core_transformer_config_from_args(model_args) if args else
                                  config or core_transformer_config_from_args(model_args), pre_process, post_process,
                                  vp_stage, pg_collection)
        parts.load_weights(model, model_cfg, model_args)
        return model

    return provider
