"""Llama (2, 3.x): GQA with grouped QKV, no q/k norm, SwiGLU MLP, tied or untied embeddings.

RoPE is plain, linear, YaRN or Llama 3's ``rope_type: llama3`` (Megatron's --use-rope-scaling, whose
frequency bands are fixed; :func:`adaptor.convert.rope.position_flags` refuses other bands).
Biases on the projections (``attention_bias``, ``mlp_bias``) are not built and are refused.
"""
from __future__ import annotations

from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import GateUp, GroupedQKV, Layout, Split
from adaptor.convert.mapping import ModelMapping, Param


class LlamaMapping(ModelMapping):
    model_type = "llama2"       # MindSpeed-LLM's --model-type-hf name for Llama 2 and 3.x
    hf_model_type = "llama"     # config.json's model_type
    qkv_bias = False

    def __init__(self, hf_config: dict):
        super().__init__(hf_config)
        found = hf_config.get("model_type")
        if found is not None and found != self.hf_model_type:
            raise ConversionError(f"config.json: model_type {found!r} is not {self.hf_model_type!r} "
                                  f"(the {self.model_type} mapping)")
        self.hidden = int(self.require("hidden_size"))
        self.heads = int(self.require("num_attention_heads"))
        self.groups = int(hf_config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(hf_config.get("head_dim") or self.hidden // self.heads)
        self.ffn = int(self.require("intermediate_size"))
        if self.heads % self.groups:
            raise ConversionError(f"config.json: num_attention_heads={self.heads} is not a multiple of "
                                  f"num_key_value_heads={self.groups}")
        for key, value in self.unsupported().items():
            if hf_config.get(key, value) != value:
                raise ConversionError(f"config.json: {key}={hf_config[key]!r} is not supported for "
                                      f"{self.model_type} (only {value!r} is built)")
        from adaptor.convert.rope import position_flags

        position_flags(hf_config)  # a RoPE setting Megatron does not build is refused here, in one line

    def unsupported(self) -> dict:
        """config.json keys whose other values this family does not build: key -> the one value built."""
        return {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "partial_rotary_factor": 1.0}

    def check_layout(self, layout: Layout) -> None:
        super().check_layout(layout)
        self.divisible(self.groups, "num_key_value_heads (query groups)", layout.tp)
        self.divisible(self.heads, "num_attention_heads", layout.tp)
        self.divisible(self.ffn, "intermediate_size", layout.tp)
        if layout.ep > 1:
            raise ConversionError(f"{self.model_type} is dense: --target-expert-parallel-size must be 1, "
                                  f"not {layout.ep}")

    def layer_params(self, prefix, hf_prefix, layer, place):
        attn, mlp = hf_prefix + "self_attn.", hf_prefix + "mlp."
        qkv = GroupedQKV(self.heads, self.groups, self.head_dim)

        def p(name, hf, rule=None, parallel=None):
            param = Param(prefix + name, tuple(hf), parallel=parallel, place=place, layer=layer)
            if rule is not None:
                param.rule = rule
            return param

        out = [
            p("input_layernorm.weight", [hf_prefix + "input_layernorm.weight"]),
            p("self_attention.linear_qkv.weight",
              [attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"], qkv, "tp"),
        ]
        if self.qkv_bias:
            out.append(p("self_attention.linear_qkv.bias",
                         [attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias"], qkv, "tp"))
        return out + [
            p("self_attention.linear_proj.weight", [attn + "o_proj.weight"], Split(1), "tp"),
            p("pre_mlp_layernorm.weight", [hf_prefix + "post_attention_layernorm.weight"]),
            p("mlp.linear_fc1.weight", [mlp + "gate_proj.weight", mlp + "up_proj.weight"], GateUp(), "tp"),
            p("mlp.linear_fc2.weight", [mlp + "down_proj.weight"], Split(1), "tp"),
        ]
