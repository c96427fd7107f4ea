"""HF config.json -> the pretrain_gpt.py flags that build the same architecture.

Training choices (sequence length, batch sizes, losses, dispatcher, parallel sizes) are
left to the caller; ``--vocab-size`` is the HF vocabulary (Megatron pads it as the
converter did, with --make-vocab-size-divisible-by 128 by default).
"""
from __future__ import annotations

from adaptor.convert.mapping import model_mapping


def _rope_parameters(config: dict) -> dict:
    rope = dict(config.get("rope_scaling") or {})
    rope.update(config.get("rope_parameters") or {})
    if "rope_theta" in config:
        rope.setdefault("rope_theta", config["rope_theta"])
    return rope


def _common(config: dict, mapping) -> list[str]:
    flags = [
        "--num-layers", str(mapping.num_layers), "--hidden-size", str(config["hidden_size"]),
        "--ffn-hidden-size", str(config["intermediate_size"]),
        "--num-attention-heads", str(config["num_attention_heads"]),
        "--max-position-embeddings", str(config.get("max_position_embeddings", 4096)),
        "--normalization", "RMSNorm", "--norm-epsilon", str(config.get("rms_norm_eps", 1e-6)),
        "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
        "--rotary-base", str(int(float(_rope_parameters(config).get("rope_theta", 10000.0)))),
        "--vocab-size", str(mapping.vocab_size),
    ]
    if not mapping.tied:
        flags.append("--untie-embeddings-and-output-weights")
    return flags


def _qwen3(config: dict, mapping) -> list[str]:
    return _common(config, mapping) + [
        "--group-query-attention", "--num-query-groups", str(mapping.groups),
        "--kv-channels", str(mapping.head_dim), "--qk-layernorm",
    ]


def _deepseek3(config: dict, mapping) -> list[str]:
    flags = _common(config, mapping) + [
        "--multi-latent-attention", "--q-lora-rank", str(mapping.q_lora_rank),
        "--kv-lora-rank", str(mapping.kv_lora_rank), "--qk-head-dim", str(mapping.nope_dim),
        "--qk-pos-emb-head-dim", str(mapping.rope_dim), "--v-head-dim", str(mapping.v_dim), "--qk-layernorm",
    ]
    rope = _rope_parameters(config)
    if rope.get("rope_type", rope.get("type")) == "yarn":
        flags += ["--rope-type", "yarn", "--rotary-scaling-factor", f"{float(rope.get('factor', 1.0)):g}"]
        for key, flag in (("original_max_position_embeddings", "--yarn-original-max-position-embeddings"),
                          ("mscale", "--mscale"), ("mscale_all_dim", "--mscale-all-dim"),
                          ("beta_fast", "--yarn-beta-fast"), ("beta_slow", "--yarn-beta-slow")):
            if rope.get(key) is not None:
                value = rope[key]
                flags += [flag, str(int(value)) if key == "original_max_position_embeddings" else f"{float(value):g}"]
    else:
        flags += ["--rope-type", "rope"]
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


def megatron_args_from_hf_config(model_type: str, hf_config: dict) -> list[str]:
    """pretrain_gpt.py model flags for `hf_config` (a config.json dict) of model_type qwen3 or deepseek3."""
    mapping = model_mapping(model_type, hf_config)
    return _qwen3(hf_config, mapping) if model_type == "qwen3" else _deepseek3(hf_config, mapping)
