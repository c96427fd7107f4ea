"""The text decoder's shape, read from a Qwen2.5-VL or Qwen3-VL ``config.json``.

transformers 5 writes the decoder's keys under ``text_config`` and ``tie_word_embeddings`` at the top;
the checkpoints published with Qwen2.5-VL keep them all at the top level, with the M-RoPE sections in
``rope_scaling`` (``type: mrope``). Both are read here into one :class:`VlTextConfig`.
"""
from __future__ import annotations

from dataclasses import dataclass

FAMILIES = {
    # model_type: (q/k/v bias, q/k RMSNorm, interleaved M-RoPE, default mrope_section)
    "qwen2_5_vl": (True, False, False, (16, 24, 24)),
    "qwen3_vl": (False, True, True, (24, 20, 20)),
}


@dataclass(frozen=True)
class VlTextConfig:
    family: str
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    norm_epsilon: float
    rope_theta: float
    mrope_section: tuple[int, int, int]
    mrope_interleaved: bool
    qkv_bias: bool
    qk_norm: bool
    tied: bool

    def flat_hf_config(self, base_model_type: str) -> dict:
        """The keys a text-only family mapping of :mod:`adaptor.convert` reads (``qwen2`` / ``qwen3``)."""
        return {"model_type": base_model_type, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_query_groups,
                "head_dim": self.head_dim, "intermediate_size": self.ffn_hidden_size, "vocab_size": self.vocab_size,
                "tie_word_embeddings": self.tied, "rope_theta": self.rope_theta}


def vl_text_config(hf_config: dict) -> VlTextConfig:
    """The decoder of a Qwen2.5-VL / Qwen3-VL config dict (``config.to_dict()`` or config.json)."""
    family = hf_config.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"config.json: model_type {family!r} is not one of {', '.join(FAMILIES)}")
    qkv_bias, qk_norm, interleaved, default_section = FAMILIES[family]
    text = {**hf_config, **(hf_config.get("text_config") or {})}
    rope = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
    kind = rope.get("rope_type", rope.get("type")) or "default"
    if kind not in ("default", "mrope"):
        raise ValueError(f"config.json: rope type {kind!r} is not built for {family} (only the plain M-RoPE)")
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    section = tuple(int(s) for s in rope.get("mrope_section") or default_section)
    if sum(section) * 2 != head_dim:
        raise ValueError(f"config.json: mrope_section {list(section)} does not sum to half of head_dim {head_dim}")
    if text.get("attention_bias") and family == "qwen3_vl":
        raise ValueError("config.json: attention_bias=true is not built for qwen3_vl")
    return VlTextConfig(
        family=family, hidden_size=int(text["hidden_size"]), ffn_hidden_size=int(text["intermediate_size"]),
        num_layers=int(text["num_hidden_layers"]), num_heads=heads,
        num_query_groups=int(text.get("num_key_value_heads") or heads), head_dim=head_dim,
        vocab_size=int(text["vocab_size"]), norm_epsilon=float(text.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))), mrope_section=section,
        mrope_interleaved=interleaved,  # transformers: Qwen3-VL always interleaves, Qwen2.5-VL never
        qkv_bias=qkv_bias, qk_norm=qk_norm,
        tied=bool(hf_config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
    )
