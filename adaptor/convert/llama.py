"""Llama (2, 3.x): GQA with grouped QKV, no q/k norm, SwiGLU MLP, tied or untied embeddings.

RoPE is plain, linear, YaRN or Llama 3's ``rope_type: llama3`` (Megatron's --use-rope-scaling, whose
frequency bands are fixed; :func:`adaptor.convert.rope.position_flags` refuses other bands).
Biases on the projections (``attention_bias``, ``mlp_bias``) are not built and are refused.
"""
from __future__ import annotations

from adaptor.convert.errors import ConversionError
from adaptor.convert.qwen3 import Qwen3Mapping


class LlamaMapping(Qwen3Mapping):
    """Qwen3's dense layers without the q/k norms."""

    model_type = "llama2"       # MindSpeed-LLM's --model-type-hf name for Llama 2 and 3.x
    hf_model_type = "llama"     # config.json's model_type
    qk_norm = False

    def __init__(self, hf_config: dict):
        found = hf_config.get("model_type")
        if found is not None and found != self.hf_model_type:
            raise ConversionError(f"config.json: model_type {found!r} is not {self.hf_model_type!r} "
                                  f"(the {self.model_type} mapping)")
        super().__init__(hf_config)
        from adaptor.convert.rope import position_flags

        position_flags(hf_config)  # a RoPE setting Megatron does not build is refused here, in one line

    def unsupported(self) -> dict:
        return {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "partial_rotary_factor": 1.0}
