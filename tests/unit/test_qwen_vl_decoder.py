"""Qwen2.5-VL and Qwen3-VL decoders (adaptor.mm.qwen_vl): positions, rotary and logits against transformers.

References, in this process, all fp32: the ``get_rope_index`` of a tiny random
``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` (text only, one image, two
images of different grids in a sample, left padding in a batch of two, videos with
``second_per_grid_ts``, Qwen3-VL's frames separated by timestamps): equal integers. Their text rotary
modules: megatron-core's ``MultimodalRotaryEmbedding`` (sectioned) and ours (interleaved) give bitwise
the same cos/sin at positions up to 5000 (both multiply the same fp32 inverse frequencies).
Their decoders (hidden 64, 4 heads in 2 groups, 2 layers) fed the token embeddings with arbitrary image
rows at the placeholders and their own positions (and Qwen3-VL's deepstack rows after layers 0 and 1):
our ``GPTModel`` loaded through the VL text mappings gives logits within 1e-4 at every kept token (measured:
2e-7; the logits are O(1)). Sectioned rotary in the Qwen3-VL decoder (0.02) or no deepstack (0.5) moves them
by far more. The published Qwen2.5-VL layout (flat config.json, ``model.`` tensor names) reads alike.
"""
from __future__ import annotations

import pytest
import torch

from adaptor.mm.qwen_vl import rope_index as P

IMAGE_ID, VIDEO_ID = 150, 151
MROPE = [2, 3, 3]  # head_dim 16: 8 frequencies
TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=160, max_position_embeddings=8192)


def hf_qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={**TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE}},
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                           tokens_per_second=2),
        image_token_id=IMAGE_ID, video_token_id=VIDEO_ID)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def hf_qwen3_vl():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(
        text_config={**TEXT, "head_dim": 16, "rope_parameters": {
            "rope_type": "default", "rope_theta": 5000.0, "mrope_section": MROPE, "mrope_interleaved": True}},
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                           patch_size=16, deepstack_visual_indexes=[0, 1], num_position_embeddings=16),
        image_token_id=IMAGE_ID, video_token_id=VIDEO_ID)
    return Qwen3VLForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def hf_models():
    torch.manual_seed(0)
    models = {"qwen2_5_vl": hf_qwen2_5_vl(), "qwen3_vl": hf_qwen3_vl()}
    with torch.no_grad():  # transformers starts RMSNorm weights at 1: make them count
        for model in models.values():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.add_(0.1 * torch.randn_like(p))
    return models


def tokens(*parts) -> list[int]:
    """Text runs (an int: that many text ids) and (placeholder id, count) runs."""
    out = []
    for part in parts:
        out += list(range(3, 3 + part)) if isinstance(part, int) else [part[0]] * part[1]
    return out


def same_as_transformers(model, ids, mine, mask=None, **grids):
    want, want_deltas = model.model.get_rope_index(ids, P.token_types(ids, IMAGE_ID, VIDEO_ID), attention_mask=mask,
                                                   **grids)
    assert torch.equal(mine[0], want), (mine[0], want)
    assert torch.equal(mine[1], want_deltas), (mine[1], want_deltas)


def test_qwen2_5_vl_positions_match_get_rope_index(hf_models):
    model = hf_models["qwen2_5_vl"]
    rope = P.qwen2_5_vl_rope_index
    # Text only.
    ids = torch.tensor([tokens(9)])
    mine = rope(P.token_types(ids, IMAGE_ID), spatial_merge_size=2)
    same_as_transformers(model, ids, mine)
    assert mine[0][0, 0].tolist() == list(range(9)) and mine[1].item() == 0
    # One image: a 4x6 patch grid merges to 2x3 tokens.
    ids, grid = torch.tensor([tokens(3, (IMAGE_ID, 6), 4)]), torch.tensor([[1, 4, 6]])
    mine = rope(P.token_types(ids, IMAGE_ID), grid)
    same_as_transformers(model, ids, mine, image_grid_thw=grid)
    assert mine[0][:, 0, 3:9].tolist() == [[3] * 6, [3, 3, 3, 4, 4, 4], [3, 4, 5, 3, 4, 5]]
    # Two images of different grids in each of two samples.
    ids = torch.tensor([tokens(3, (IMAGE_ID, 4), 2, (IMAGE_ID, 12), 3), tokens(2, (IMAGE_ID, 12), 4, (IMAGE_ID, 4), 2)])
    grid = torch.tensor([[1, 4, 4], [1, 6, 8], [1, 6, 8], [1, 4, 4]])
    same_as_transformers(model, ids, rope(P.token_types(ids, IMAGE_ID), grid), image_grid_thw=grid)
    # Left padding in a batch of two, an image and videos 1.3 s and 0.5 s per grid apart (2.6 and 1 positions).
    ids = torch.tensor([[0, 0] + tokens(2, (VIDEO_ID, 12), 3), tokens(1, (IMAGE_ID, 4), 5, (VIDEO_ID, 8), 1)])
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    image, video, seconds = torch.tensor([[1, 4, 4]]), torch.tensor([[3, 4, 4], [2, 4, 4]]), torch.tensor([1.3, 0.5])
    mine = rope(P.token_types(ids, IMAGE_ID, VIDEO_ID), image, video, seconds, mask, tokens_per_second=2)
    same_as_transformers(model, ids, mine, mask, image_grid_thw=image, video_grid_thw=video,
                         second_per_grid_ts=seconds)
    assert mine[0][0, 0, 4:16:4].tolist() == [2, 4, 7] and mine[0][:, 0, :2].abs().sum() == 0
    # Generation: a text token after the prompt sits at its index + delta.
    prompt = torch.tensor([tokens(2, (IMAGE_ID, 12), 3)])
    longer = torch.cat([prompt, torch.tensor([[7]])], dim=1)
    grid = torch.tensor([[1, 6, 8]])
    _, deltas = rope(P.token_types(prompt, IMAGE_ID), grid)
    whole, _ = rope(P.token_types(longer, IMAGE_ID), grid)
    assert torch.equal(P.generation_positions(deltas, prompt.shape[1])[:, :, 0], whole[:, :, -1])


def test_qwen3_vl_positions_match_get_rope_index(hf_models):
    model = hf_models["qwen3_vl"]
    # An image, then a 3-frame video whose frames follow timestamp text; a padded second sample.
    ids = torch.tensor([tokens(2, (IMAGE_ID, 4), 1, (VIDEO_ID, 4), 1, (VIDEO_ID, 4), 1, (VIDEO_ID, 4), 2),
                        [0] * 10 + tokens(3, (IMAGE_ID, 6), 4)])
    mask = torch.ones_like(ids)
    mask[1, :10] = 0
    image, video = torch.tensor([[1, 4, 4], [1, 4, 6]]), torch.tensor([[3, 4, 4]])
    mine = P.qwen3_vl_rope_index(P.token_types(ids, IMAGE_ID, VIDEO_ID), image, video, mask)
    same_as_transformers(model, ids, mine, mask, image_grid_thw=image, video_grid_thw=video.clone())
    # Every frame starts a new temporal position (no tokens_per_second scaling).
    assert mine[0][0, 0, [7, 12, 17]].tolist() == [5, 8, 11]


def test_placeholders_and_grids_must_agree_in_one_line():
    types = P.token_types(torch.tensor([tokens(2, (IMAGE_ID, 8), 1)]), IMAGE_ID)
    with pytest.raises(ValueError, match="^8 image placeholder tokens but the 1 image grids given hold 4$"):
        P.qwen2_5_vl_rope_index(types, torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match="not one run of one sample"):
        P.qwen2_5_vl_rope_index(P.token_types(torch.tensor([tokens(1, (IMAGE_ID, 2), 1, (IMAGE_ID, 2))]), IMAGE_ID),
                                torch.tensor([[1, 4, 4]]))


def test_rotary_tables_match_transformers(hf_models, cpu_training_process):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding

    from adaptor.mm.qwen_vl.rotary import AxisTableRotaryEmbedding

    torch.manual_seed(1)
    positions = torch.randint(0, 5000, (3, 2, 40))
    x = torch.zeros(1, dtype=torch.float32)
    for family, ours in (("qwen2_5_vl", MultimodalRotaryEmbedding(16, 1.0, rotary_base=10000)),
                         ("qwen3_vl", AxisTableRotaryEmbedding(16, 5000.0, MROPE, interleaved=True))):
        cos, sin = hf_models[family].model.language_model.rotary_emb(x, positions)
        emb = ours(positions, MROPE)[:, :, 0].transpose(0, 1)  # [b, s, d]
        assert torch.equal(emb.cos(), cos) and torch.equal(emb.sin(), sin), family  # the same fp32 angles
    sectioned = AxisTableRotaryEmbedding(16, 10000.0, MROPE, interleaved=False)(positions)
    assert torch.equal(sectioned, MultimodalRotaryEmbedding(16, 1.0, rotary_base=10000)(positions, MROPE))
    assert (sectioned - AxisTableRotaryEmbedding(16, 10000.0, MROPE)(positions)).abs().max() > 1.0
    # A model cast to bf16 keeps fp32 frequencies, as megatron-core's rotary modules do.
    assert AxisTableRotaryEmbedding(16, 10000.0, MROPE).bfloat16().inv_freq.dtype == torch.float32


def hf_logits(model, ids, mask, positions, image_rows, video_rows, deepstack=None):
    """transformers' decoder on its own placement of the image and video rows and its own positions."""
    text = model.model.language_model
    embeds = text.embed_tokens(ids)
    embeds = embeds.masked_scatter((ids == IMAGE_ID)[..., None], image_rows)
    embeds = embeds.masked_scatter((ids == VIDEO_ID)[..., None], video_rows)
    visual = (ids == IMAGE_ID) | (ids == VIDEO_ID)
    extra = {} if deepstack is None else {"visual_pos_masks": visual, "deepstack_visual_embeds": deepstack}
    hidden = text(inputs_embeds=embeds, position_ids=positions, attention_mask=mask, **extra).last_hidden_state
    return model.lm_head(hidden)


def published_layout_reads_alike(hf, checkpoint, directory):
    """The published Qwen2.5-VL layout: decoder keys at the top of config.json (M-RoPE in ``rope_scaling``,
    ``type: mrope``), tensors under ``model.`` rather than ``model.language_model.``."""
    import json

    from safetensors.torch import save_file

    from adaptor.convert import HfCheckpoint
    from adaptor.mm.qwen_vl.text_config import vl_text_config
    from adaptor.mm.qwen_vl.text_weights import text_decoder_tensors

    config = hf.config.to_dict()
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**config, **text, "model_type": "qwen2_5_vl", "rope_theta": rope["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}}
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(flat))
    state = {k.replace("model.language_model.", "model."): v.contiguous() for k, v in hf.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    published = HfCheckpoint(directory)
    assert vl_text_config(published.config) == vl_text_config(checkpoint.config)
    mine = dict(text_decoder_tensors(published, padded_vocab_size=160))
    theirs = dict(text_decoder_tensors(checkpoint, padded_vocab_size=160))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_decoder_logits_match_transformers(hf_models, model_parallel, tmp_path, family):
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from adaptor.convert import HfCheckpoint
    from adaptor.convert.online import copy_into
    from adaptor.mm.qwen_vl.decoder import build_decoder, decoder_transformer_config
    from adaptor.mm.qwen_vl.forward import vl_logits
    from adaptor.mm.qwen_vl.rotary import AxisTableRotaryEmbedding
    from adaptor.mm.qwen_vl.text_config import vl_text_config
    from adaptor.mm.qwen_vl.text_weights import text_decoder_tensors

    hf = hf_models[family]
    hf.save_pretrained(tmp_path)
    checkpoint = HfCheckpoint(tmp_path)
    text = vl_text_config(checkpoint.config)
    assert (text.qkv_bias, text.qk_norm, text.mrope_interleaved) == ((True, False, False) if family == "qwen2_5_vl"
                                                                      else (False, True, True))
    model_parallel_cuda_manual_seed(1)
    model = build_decoder(text, decoder_transformer_config(text, use_cpu_initialization=True)).eval()
    assert copy_into(model, text_decoder_tensors(checkpoint, padded_vocab_size=160), "decoder") == len(
        [n for n in model.state_dict() if not n.endswith("_extra_state")])

    # Two samples: two images of different grids, then a video of two frames (Qwen3-VL: timestamp text
    # between the frames); one image and a video after left padding.
    video = [(VIDEO_ID, 8), 1] if family == "qwen2_5_vl" else [(VIDEO_ID, 4), 1, (VIDEO_ID, 4), 1]
    ids = torch.tensor([tokens(3, (IMAGE_ID, 4), 2, (IMAGE_ID, 6), 3, *video),
                        [0, 0, 0] + tokens(4, (IMAGE_ID, 6), 5, *video)])
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    grids = dict(image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 6], [1, 4, 6]]),
                 video_grid_thw=torch.tensor([[2, 4, 4], [2, 4, 4]]), second_per_grid_ts=torch.tensor([1.3, 0.5]))
    torch.manual_seed(2)
    images, videos = torch.randn(16, 64), torch.randn(16, 64)
    deepstack = [torch.randn(32, 64), torch.randn(32, 64)] if family == "qwen3_vl" else None
    types = P.token_types(ids, IMAGE_ID, VIDEO_ID)
    positions, _ = hf.model.get_rope_index(ids, types, attention_mask=mask, **grids)

    def ours(**kw):
        return vl_logits(model, text, ids, image_token_id=IMAGE_ID, video_token_id=VIDEO_ID, image_embeds=images,
                         video_embeds=videos, attention_mask=mask, **grids, **kw)

    with torch.no_grad():
        want = hf_logits(hf, ids, mask, positions, images, videos, deepstack)
        got = ours(deepstack_embeds=deepstack)
        keep = mask.bool()
        error = (got[keep] - want[keep]).abs().max().item()
        assert got.shape == want.shape and error < 1e-4, error
        if family == "qwen3_vl":  # the interleaved table and the deepstack rows both show in the logits
            assert (ours()[keep] - want[keep]).abs().max() > 1e-2
            model.rotary_pos_emb = AxisTableRotaryEmbedding(16, text.rope_theta, MROPE, interleaved=False)
            assert (ours(deepstack_embeds=deepstack)[keep] - want[keep]).abs().max() > 1e-3
    if family == "qwen2_5_vl":
        published_layout_reads_alike(hf, checkpoint, tmp_path / "published")
    images = images[:15]
    with pytest.raises(ValueError, match="^16 image placeholder tokens but 15 image embeddings$"):
        ours()
