"""Qwen2 / Qwen2.5 (and the R1-Distill-Qwen models): Llama's layers with a bias on q, k and v
(Megatron's --add-qkv-bias), tied or untied embeddings. Sliding-window attention is not built."""
from __future__ import annotations

from adaptor.convert.errors import ConversionError
from adaptor.convert.llama import LlamaMapping


class Qwen2Mapping(LlamaMapping):
    model_type = "qwen2"
    hf_model_type = "qwen2"
    qkv_bias = True

    def __init__(self, hf_config: dict):
        super().__init__(hf_config)
        sliding = [i for i, kind in enumerate(hf_config.get("layer_types") or []) if kind != "full_attention"]
        if hf_config.get("use_sliding_window"):
            raise ConversionError("config.json: use_sliding_window=true is not supported for qwen2 "
                                  "(sliding-window attention is not built)")
        if sliding:
            raise ConversionError(f"config.json: layer_types names {hf_config['layer_types'][sliding[0]]!r} "
                                  f"for layer {sliding[0]}; only full_attention is built for qwen2")

    def unsupported(self) -> dict:
        # Qwen2's q/k/v always carry a bias and its o_proj and MLP never do: attention_bias is not read.
        return {"hidden_act": "silu", "partial_rotary_factor": 1.0}
