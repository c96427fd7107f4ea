"""HF config.json -> the pretrain_gpt.py flags that build the same architecture.

Training choices (sequence length, batch sizes, losses, dispatcher, parallel sizes) are
left to the caller; ``--vocab-size`` is the HF vocabulary (Megatron pads it as the
converter did, with --make-vocab-size-divisible-by 128 by default).
"""
from __future__ import annotations

from adaptor.convert.errors import ConversionError
from adaptor.convert.models import model_mapping
from adaptor.convert.rope import _rope_parameters, _rope_type, position_flags


def _common(config: dict, mapping) -> list[str]:
    flags = [
        "--num-layers", str(mapping.num_layers), "--hidden-size", str(config["hidden_size"]),
        "--ffn-hidden-size", str(config["intermediate_size"]),
        "--num-attention-heads", str(config["num_attention_heads"]),
        "--max-position-embeddings", str(config.get("max_position_embeddings", 4096)),
        "--normalization", "RMSNorm", "--norm-epsilon", str(config.get("rms_norm_eps", 1e-6)),
        "--swiglu", "--disable-bias-linear",
        "--rotary-base", str(int(float(_rope_parameters(config).get("rope_theta", 10000.0)))),
        "--vocab-size", str(mapping.vocab_size),
    ]
    if not mapping.tied:
        flags.append("--untie-embeddings-and-output-weights")
    return flags


def _qwen3(config: dict, mapping) -> list[str]:
    return _common(config, mapping) + position_flags(config) + [
        "--group-query-attention", "--num-query-groups", str(mapping.groups),
        "--kv-channels", str(mapping.head_dim), "--qk-layernorm",
    ]


def _llama(config: dict, mapping) -> list[str]:
    """llama2 (Llama 2 / 3.x) and qwen2 (Qwen2.5: the same layers with --add-qkv-bias)."""
    flags = _common(config, mapping) + position_flags(config) + [
        "--group-query-attention", "--num-query-groups", str(mapping.groups), "--kv-channels", str(mapping.head_dim),
    ]
    return flags + (["--add-qkv-bias"] if mapping.qkv_bias else [])


def _deepseek3(config: dict, mapping) -> list[str]:
    flags = _common(config, mapping) + ["--position-embedding-type", "rope",
        "--multi-latent-attention", "--q-lora-rank", str(mapping.q_lora_rank),
        "--kv-lora-rank", str(mapping.kv_lora_rank), "--qk-head-dim", str(mapping.nope_dim),
        "--qk-pos-emb-head-dim", str(mapping.rope_dim), "--v-head-dim", str(mapping.v_dim), "--qk-layernorm",
    ]
    rope = _rope_parameters(config)
    if _rope_type(rope) == "yarn":
        flags += ["--rope-type", "yarn", "--rotary-scaling-factor", f"{float(rope.get('factor', 1.0)):g}"]
        for key, flag in (("original_max_position_embeddings", "--yarn-original-max-position-embeddings"),
                          ("mscale", "--mscale"), ("mscale_all_dim", "--mscale-all-dim"),
                          ("beta_fast", "--yarn-beta-fast"), ("beta_slow", "--yarn-beta-slow")):
            if rope.get(key) is not None:
                value = rope[key]
                flags += [flag, str(int(value)) if key == "original_max_position_embeddings" else f"{float(value):g}"]
    elif _rope_type(rope) == "default":
        flags += ["--rope-type", "rope"]
    else:
        raise ConversionError(f"config.json: rope_scaling type {_rope_type(rope)!r} has no Megatron equivalent for "
                              f"multi-latent attention (supported: default, yarn)")
    freq = [1 if mapping.is_moe(i) else 0 for i in range(mapping.num_layers)]
    scoring = config.get("scoring_func", "sigmoid")
    flags += [
        "--num-experts", str(mapping.num_experts), "--moe-layer-freq", "[" + ",".join(map(str, freq)) + "]",
        "--moe-ffn-hidden-size", str(mapping.moe_ffn), "--moe-router-topk", str(config["num_experts_per_tok"]),
        "--moe-router-score-function", scoring, "--moe-router-dtype", "fp32",
        "--moe-router-topk-scaling-factor", f"{float(config.get('routed_scaling_factor', 1.0)):g}",
    ]
    if mapping.shared_ffn:
        flags += ["--moe-shared-expert-intermediate-size", str(mapping.shared_ffn)]
    if config.get("topk_method", "noaux_tc") == "noaux_tc":
        flags.append("--moe-router-enable-expert-bias")
    if (config.get("n_group") or 1) > 1:
        flags += ["--moe-router-num-groups", str(config["n_group"]),
                  "--moe-router-group-topk", str(config["topk_group"])]
    if mapping.mtp_layers:
        flags += ["--mtp-num-layers", str(mapping.mtp_layers)]
    return flags


def _routed_moe(config: dict, mapping) -> list[str]:
    """Qwen3-MoE and Mixtral: GQA (q/k norms for Qwen3-MoE), softmax top-k experts, no shared experts.

    transformers takes the softmax over all experts, then the top k; renormalising those k weights
    (``norm_topk_prob``, always in Mixtral) is Megatron's default softmax over the top-k logits, and
    keeping them as they are is ``--moe-router-pre-softmax``.
    """
    flags = _common(config, mapping) + position_flags(config) + [
        "--group-query-attention", "--num-query-groups", str(mapping.groups), "--kv-channels", str(mapping.head_dim),
    ]
    if mapping.qk_norm:
        flags.append("--qk-layernorm")
    flags += [
        "--num-experts", str(mapping.num_experts),
        "--moe-layer-freq", "[" + ",".join(map(str, mapping.moe_layer_freq())) + "]",
        "--moe-ffn-hidden-size", str(mapping.moe_ffn), "--moe-router-topk", str(mapping.topk),
        "--moe-router-score-function", "softmax", "--moe-router-dtype", "fp32",
    ]
    if not mapping.norm_topk():
        flags.append("--moe-router-pre-softmax")
    return flags


FAMILY_FLAGS = {"qwen3": _qwen3, "deepseek3": _deepseek3, "llama2": _llama, "qwen2": _llama,
                "qwen3-moe": _routed_moe, "mixtral": _routed_moe}


def megatron_args_from_hf_config(model_type: str, hf_config: dict) -> list[str]:
    """pretrain_gpt.py model flags for `hf_config` (a config.json dict) of a family of MODELS."""
    mapping = model_mapping(model_type, hf_config)
    return FAMILY_FLAGS[model_type](hf_config, mapping)
