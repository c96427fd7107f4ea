"""Qwen3 (dense): GQA with grouped QKV, q/k RMSNorm, SwiGLU MLP, tied or untied embeddings."""
from __future__ import annotations

from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import GateUp, GroupedQKV, Layout, Split
from adaptor.convert.mapping import ModelMapping, Param


class Qwen3Mapping(ModelMapping):
    """Also the base of the other dense GQA families (Llama, Qwen2), which differ in the two switches."""

    model_type = "qwen3"
    qk_norm = True  # q_norm / k_norm RMSNorm weights (--qk-layernorm)
    qkv_bias = False  # a bias on q, k and v (--add-qkv-bias)

    def __init__(self, hf_config: dict):
        super().__init__(hf_config)
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

    def unsupported(self) -> dict:
        """config.json keys whose other values this family does not build: key -> the one value built."""
        return {"attention_bias": False}

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
        if self.qk_norm:
            out += [p("self_attention.q_layernorm.weight", [attn + "q_norm.weight"]),
                    p("self_attention.k_layernorm.weight", [attn + "k_norm.weight"])]
        return out + [
            p("self_attention.linear_proj.weight", [attn + "o_proj.weight"], Split(1), "tp"),
            p("pre_mlp_layernorm.weight", [hf_prefix + "post_attention_layernorm.weight"]),
            p("mlp.linear_fc1.weight", [mlp + "gate_proj.weight", mlp + "up_proj.weight"], GateUp(), "tp"),
            p("mlp.linear_fc2.weight", [mlp + "down_proj.weight"], Split(1), "tp"),
        ]
