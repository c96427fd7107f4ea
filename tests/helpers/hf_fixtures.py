"""Tiny random Hugging Face checkpoints, saved as the Hub publishes them.

Every parameter is random (norm weights around 1, biases non-zero) so that a
mapping that swaps two tensors of the same shape is caught by a comparison.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

VOCAB_SIZE = 512
HIDDEN_SIZE = 64


def _randomize(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if not tensor.is_floating_point() or "rotary_emb" in name:
                continue
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            if "norm" in name:
                tensor.copy_(1.0 + 0.1 * noise)
            elif "e_score_correction_bias" in name:
                tensor.copy_(0.05 * noise)
            else:
                tensor.copy_(0.05 * noise)


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():
                tensors[name] = handle.get_tensor(name)
        file.unlink()
    index = path / "model.safetensors.index.json"
    if index.exists():
        index.unlink()
    return tensors


def write_safetensors_shards(path: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    """Write `tensors` as model.safetensors (shards=1) or N shards + index, in name order."""
    names = sorted(tensors)
    if shards <= 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(path / "model.safetensors"),
                  metadata={"format": "pt"})
        return
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    target = total / shards
    groups: list[list[str]] = [[] for _ in range(shards)]
    filled = 0
    for name in names:
        shard = min(int(filled // target), shards - 1)
        groups[shard].append(name)
        filled += tensors[name].numel() * tensors[name].element_size()
    weight_map = {}
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in group}, str(path / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in group})
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def _save_random(model_class, config, path: Path, seed: int, shards: int) -> Path:
    """``model_class(config)`` in fp32 with random weights (seeded), saved as transformers saves it, in
    ``shards`` safetensors files."""
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    _randomize(model, seed)
    model.save_pretrained(path)
    if shards > 1:
        write_safetensors_shards(path, _read_weights(path), shards)
    return path


def make_tiny_qwen3(path, tied: bool = True, shards: int = 1, seed: int = 0, vocab_size: int = VOCAB_SIZE,
                    rope_scaling: dict | None = None, head_dim: int = 32) -> Path:
    """A 4-layer Qwen3ForCausalLM: GQA 4 heads / 2 groups, head_dim 32 != 64/4, qk-norm, rope 1e6.

    ``rope_scaling``: extra RoPE parameters, e.g. YaRN's ``{"rope_type": "yarn", "factor": 4.0, ...}``.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=HIDDEN_SIZE, intermediate_size=192, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, **(rope_scaling or {})},
        tie_word_embeddings=tied, attention_bias=False, hidden_act="silu",
        bos_token_id=0, eos_token_id=1,
    )
    return _save_random(Qwen3ForCausalLM, config, path, seed, shards)


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def make_tiny_llama(path, tied: bool = False, shards: int = 1, seed: int = 0, rope_scaling: dict | None = None,
                    family: str = "llama", vocab_size: int = VOCAB_SIZE) -> Path:
    """A 4-layer LlamaForCausalLM (``family="qwen2"``: Qwen2ForCausalLM, q/k/v bias): GQA 8 heads / 2 groups,
    head_dim 14 (8 x 14 != 64), MLP 160, rope_theta 1e4; Llama with Llama 3's RoPE scaling (factor 8), under
    which two of the 7 frequencies fall in the scaled and the smoothed bands; ``rope_scaling`` replaces it."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    default = LLAMA3_ROPE if family == "llama" else {"rope_type": "default"}
    rope = {"rope_theta": 10000.0, **(default if rope_scaling is None else rope_scaling)}
    shape = dict(vocab_size=vocab_size, hidden_size=HIDDEN_SIZE, intermediate_size=160, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=14, max_position_embeddings=64,
                 rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=tied, hidden_act="silu",
                 bos_token_id=0, eos_token_id=1)
    if family == "qwen2":
        config, model_class = Qwen2Config(**shape, use_sliding_window=False), Qwen2ForCausalLM
    else:
        config, model_class = LlamaConfig(**shape, attention_bias=False, mlp_bias=False), LlamaForCausalLM
    return _save_random(model_class, config, path, seed, shards)


def make_tiny_qwen3_moe(path, seed: int = 0, shards: int = 2, **overrides) -> Path:
    """A 4-layer Qwen3MoeForCausalLM: 6 heads / 2 groups of head_dim 12 (!= 64/6), 6 experts of 24, top-2 without
    renormalising (norm_topk_prob false, transformers' default), layer 2 dense (mlp_only_layers) of 96, untied.
    ``overrides``: other config values (norm_topk_prob, decoder_sparse_step, ...)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = Qwen3MoeConfig(**{
        "vocab_size": VOCAB_SIZE, "hidden_size": HIDDEN_SIZE, "intermediate_size": 96, "moe_intermediate_size": 24,
        "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 12,
        "num_experts": 6, "num_experts_per_tok": 2, "norm_topk_prob": False, "decoder_sparse_step": 1,
        "mlp_only_layers": [2], "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 1, **overrides})
    return _save_random(Qwen3MoeForCausalLM, config, path, seed, shards)


def make_tiny_mixtral(path, seed: int = 0, shards: int = 1, **overrides) -> Path:
    """A 4-layer MixtralForCausalLM: 6 heads / 2 groups of head_dim 12, 6 experts of 40, top-3, untied."""
    from transformers import MixtralConfig, MixtralForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = MixtralConfig(**{
        "vocab_size": VOCAB_SIZE, "hidden_size": HIDDEN_SIZE, "intermediate_size": 40, "num_hidden_layers": 4,
        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 12, "num_local_experts": 6,
        "num_experts_per_tok": 3, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": False,
        "sliding_window": None, "router_jitter_noise": 0.0, "bos_token_id": 0, "eos_token_id": 1, **overrides})
    return _save_random(MixtralForCausalLM, config, path, seed, shards)


def _mtp_layer_tensors(config, layer_index: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The tensors of one DeepSeek-V3 MTP layer (a MoE decoder layer plus its MTP parts)."""
    h, v = config.hidden_size, config.vocab_size
    heads = config.num_attention_heads
    qk_head = config.qk_nope_head_dim + config.qk_rope_head_dim
    shapes = {
        "enorm.weight": (h,), "hnorm.weight": (h,), "eh_proj.weight": (h, 2 * h),
        "shared_head.norm.weight": (h,), "shared_head.head.weight": (v, h), "embed_tokens.weight": (v, h),
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_a_proj.weight": (config.q_lora_rank, h),
        "self_attn.q_a_layernorm.weight": (config.q_lora_rank,),
        "self_attn.q_b_proj.weight": (heads * qk_head, config.q_lora_rank),
        "self_attn.kv_a_proj_with_mqa.weight": (config.kv_lora_rank + config.qk_rope_head_dim, h),
        "self_attn.kv_a_layernorm.weight": (config.kv_lora_rank,),
        "self_attn.kv_b_proj.weight": (heads * (config.qk_nope_head_dim + config.v_head_dim),
                                       config.kv_lora_rank),
        "self_attn.o_proj.weight": (h, heads * config.v_head_dim),
        "mlp.gate.weight": (config.n_routed_experts, h),
        "mlp.gate.e_score_correction_bias": (config.n_routed_experts,),
    }
    moe = config.moe_intermediate_size
    for e in range(config.n_routed_experts):
        shapes[f"mlp.experts.{e}.gate_proj.weight"] = (moe, h)
        shapes[f"mlp.experts.{e}.up_proj.weight"] = (moe, h)
        shapes[f"mlp.experts.{e}.down_proj.weight"] = (h, moe)
    shared = moe * config.n_shared_experts
    shapes["mlp.shared_experts.gate_proj.weight"] = (shared, h)
    shapes["mlp.shared_experts.up_proj.weight"] = (shared, h)
    shapes["mlp.shared_experts.down_proj.weight"] = (h, shared)
    tensors = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        tensors[f"model.layers.{layer_index}.{name}"] = 1.0 + 0.1 * noise if "norm" in name else 0.05 * noise
    return tensors


def make_tiny_deepseek_v3(path, mtp_layers: int = 1, shards: int = 2, seed: int = 0,
                          vocab_size: int = VOCAB_SIZE) -> Path:
    """A 4-layer DeepseekV3ForCausalLM (1 dense + 3 MoE layers) plus `mtp_layers` MTP layers.

    MLA: q_lora_rank 32, kv_lora_rank 24, qk nope 16 / rope 8, v 16 (matches
    tests/helpers/megatron_runs.py's TINY_DEEPSEEK_V3). MoE: 4 routed experts, top-2, 2 groups
    limited to 1, sigmoid scores with a non-zero correction bias, scaling 2.5,
    one shared expert. YaRN RoPE (factor 4 over 16 original positions).
    """
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = DeepseekV3Config(
        vocab_size=vocab_size, hidden_size=HIDDEN_SIZE, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=4, routed_scaling_factor=2.5, kv_lora_rank=24, q_lora_rank=32,
        qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=2, topk_group=1,
        num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=False, num_nextn_predict_layers=mtp_layers,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        bos_token_id=0, eos_token_id=1,
    )
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config).to(torch.float32)
    _randomize(model, seed)
    model.save_pretrained(path)
    tensors = _read_weights(path)
    generator = torch.Generator().manual_seed(seed + 1)
    for k in range(mtp_layers):
        layer = _mtp_layer_tensors(config, config.num_hidden_layers + k, generator)
        # As published: the MTP layer's embedding and head are copies of the main model's.
        layer[f"model.layers.{config.num_hidden_layers + k}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
        layer[f"model.layers.{config.num_hidden_layers + k}.shared_head.head.weight"] = tensors["lm_head.weight"]
        tensors.update(layer)
    write_safetensors_shards(path, tensors, shards)
    # The published config names the MTP depth and the scoring function explicitly.
    config_file = path / "config.json"
    config_dict = json.loads(config_file.read_text())
    config_dict["num_nextn_predict_layers"] = mtp_layers
    config_dict.setdefault("scoring_func", "sigmoid")
    config_dict.setdefault("topk_method", "noaux_tc")
    config_file.write_text(json.dumps(config_dict, indent=2))
    return path


def make_tiny_vision_tower(path, kind: str = "clip", layers: int = 3, seed: int = 0) -> Path:
    """A 32x32-pixel, patch-8 CLIPVisionModel (quick_gelu, class token, pre-norm) or SiglipVisionModel
    (gelu tanh, patch bias, post-norm): hidden 64, 4 heads, MLP 128."""
    from transformers import CLIPVisionConfig, CLIPVisionModel, SiglipVisionConfig, SiglipVisionModel

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shape = dict(hidden_size=HIDDEN_SIZE, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                 num_channels=3, image_size=32, patch_size=8)
    if kind == "clip":
        model = CLIPVisionModel(CLIPVisionConfig(**shape, hidden_act="quick_gelu", layer_norm_eps=1e-5))
    else:
        model = SiglipVisionModel(SiglipVisionConfig(**shape, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6))
    model = model.to(torch.float32)
    _randomize(model, seed)
    model.save_pretrained(path)
    return path


VL_IMAGE_TOKEN, VL_VIDEO_TOKEN, VL_VISION_START = 150, 151, 152
VL_TEXT = dict(hidden_size=HIDDEN_SIZE, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=160, max_position_embeddings=4096, rms_norm_eps=1e-6,
               bos_token_id=0, eos_token_id=1)


def make_tiny_qwen2_5_vl(path, seed: int = 0, tied: bool = True, vocab_size: int = 160,
                         vision_token_ids: tuple[int, int, int] = (VL_IMAGE_TOKEN, VL_VIDEO_TOKEN, VL_VISION_START)
                         ) -> Path:
    """A Qwen2_5_VLForConditionalGeneration: decoder hidden 64, 4 heads / 2 groups, 2 layers, M-RoPE sections
    [2, 3, 3] (head_dim 16), q/k/v bias; vision tower 2 blocks of hidden 32 (one windowed, 56-pixel windows,
    one full), 14-pixel patches merged 2x2. ``vision_token_ids``: the image, video and vision-start ids (a
    real tokenizer's, for training on its data)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={**VL_TEXT, "vocab_size": vocab_size, "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=HIDDEN_SIZE,
                           window_size=56, fullatt_block_indexes=[1], tokens_per_second=2),
        image_token_id=vision_token_ids[0], video_token_id=vision_token_ids[1],
        vision_start_token_id=vision_token_ids[2], tie_word_embeddings=tied)
    return _save_random_vl(Qwen2_5_VLForConditionalGeneration, config, path, seed)


def make_tiny_qwen3_vl(path, seed: int = 0, tied: bool = False) -> Path:
    """A Qwen3VLForConditionalGeneration: decoder as :func:`make_tiny_qwen2_5_vl` with q/k RMSNorm and interleaved
    M-RoPE; vision tower 2 blocks of hidden 32, 16-pixel patches, a 4x4 learned position table, deepstack
    features after block 0 (added after decoder layer 0)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(
        text_config={**VL_TEXT, "head_dim": 16, "rope_parameters": {
            "rope_type": "default", "rope_theta": 5000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True}},
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=HIDDEN_SIZE,
                           patch_size=16, deepstack_visual_indexes=[0], num_position_embeddings=16),
        image_token_id=VL_IMAGE_TOKEN, video_token_id=VL_VIDEO_TOKEN, vision_start_token_id=VL_VISION_START,
        tie_word_embeddings=tied)
    return _save_random_vl(Qwen3VLForConditionalGeneration, config, path, seed)


def _save_random_vl(model_class, config, path, seed: int) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    _randomize(model, seed)
    model.save_pretrained(path)
    return path


if __name__ == "__main__":  # python tests/helpers/hf_fixtures.py OUT_DIR: writes both tiny models
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny_hf")
    make_tiny_qwen3(out / "qwen3_tied", tied=True)
    make_tiny_qwen3(out / "qwen3_untied", tied=False, shards=2)
    make_tiny_deepseek_v3(out / "deepseek_v3", mtp_layers=1, shards=2)
    print(os.fspath(out))


def make_peft_adapter(base_dir, out, r: int, alpha: float, targets: list[str], seed: int = 0) -> Path:
    """A LoRA adapter written by peft itself on a Qwen3 directory: random non-zero A and B, A shared within
    q/k/v and within gate/up (as Megatron's fused linears hold them)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                  task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in peft_model.base_model.model.model.layers:
            for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                           layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                for which in (module.lora_A["default"], module.lora_B["default"]):
                    which.weight.copy_(0.1 * torch.randn(which.weight.shape, generator=g))
            for group in ((layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                          (layer.mlp.gate_proj, layer.mlp.up_proj)):
                for module in group[1:]:
                    module.lora_A["default"].weight.copy_(group[0].lora_A["default"].weight)
    peft_model.save_pretrained(out)
    return Path(out)


def make_peft_attention_adapter(base_dir, out, r: int, alpha: float, seed: int = 0) -> Path:
    """A LoRA adapter written by peft on the attention projections (q/k/v/o) of any decoder directory: random
    non-zero A and B, A shared within q/k/v (Megatron's fused linear_qkv has one). Routed experts have no PEFT
    layout, so MoE models are adapted here."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, task_type="CAUSAL_LM",
                                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in peft_model.base_model.model.model.layers:
            attn = layer.self_attn
            for module in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                for which in (module.lora_A["default"], module.lora_B["default"]):
                    which.weight.copy_(0.1 * torch.randn(which.weight.shape, generator=g))
            for module in (attn.k_proj, attn.v_proj):
                module.lora_A["default"].weight.copy_(attn.q_proj.lora_A["default"].weight)
    peft_model.save_pretrained(out)
    return Path(out)
