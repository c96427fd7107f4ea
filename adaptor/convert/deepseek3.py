"""DeepSeek-V3: MLA, dense first layers then MoE (routed experts per HF tensor, shared experts,
sigmoid router with correction bias), MTP layers at HF index num_hidden_layers + k.

Megatron's MTP layer shares the main embedding and output layer; the Hub checkpoint stores
copies (``embed_tokens``, ``shared_head.head``) that must equal them and are written back as copies.
HF's ``rope_interleave`` layout is what Megatron's MLA applies (mla_rotary_interleaved), so the
rotary columns are copied as they are.
"""
from __future__ import annotations

from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import GateUp, Layout, Split
from adaptor.convert.mapping import EMBEDDING, HF_EMBEDDING, HF_OUTPUT, OUTPUT, ModelMapping, Param


class DeepSeek3Mapping(ModelMapping):
    model_type = "deepseek3"
    has_mtp_embedding = True

    def __init__(self, hf_config: dict):
        super().__init__(hf_config)
        need = self.require
        self.hidden = int(need("hidden_size"))
        self.heads = int(need("num_attention_heads"))
        self.q_lora_rank = hf_config.get("q_lora_rank")
        self.kv_lora_rank = int(need("kv_lora_rank"))
        self.rope_dim = int(need("qk_rope_head_dim"))
        self.nope_dim = int(need("qk_nope_head_dim"))
        self.v_dim = int(need("v_head_dim"))
        self.ffn = int(need("intermediate_size"))
        self.moe_ffn = int(need("moe_intermediate_size"))
        self.num_experts = int(need("n_routed_experts"))
        self.shared_ffn = self.moe_ffn * int(hf_config.get("n_shared_experts") or 0)
        self.first_dense = int(hf_config.get("first_k_dense_replace", 0))
        self.moe_freq = int(hf_config.get("moe_layer_freq", 1))
        self.mtp_layers = int(hf_config.get("num_nextn_predict_layers") or 0)
        if self.tied:
            raise ConversionError("config.json: tie_word_embeddings=true is not supported for deepseek3")
        if hf_config.get("rope_interleave") is False:
            raise ConversionError("config.json: rope_interleave=false is not supported for deepseek3 "
                                  "(Megatron's MLA applies the interleaved rotary layout)")
        # Settings under which transformers' DeepseekV3 computes something Megatron's MoE/MLA does not:
        # converting would give a model with other outputs, so refuse with the setting named.
        differs = {
            "norm_topk_prob": (hf_config.get("norm_topk_prob", True) is not False,
                               "Megatron always renormalises the sigmoid top-k weights"),
            "scoring_func": (hf_config.get("scoring_func", "sigmoid") == "sigmoid",
                             "transformers' DeepseekV3 router always uses sigmoid scores"),
            "hidden_act": (hf_config.get("hidden_act", "silu") == "silu", "the MLP is SwiGLU (silu)"),
            "rms_norm_eps": (float(hf_config.get("rms_norm_eps", 1e-6)) == 1e-6,
                             "transformers' q_a/kv_a latent norms use 1e-6 whatever rms_norm_eps says, "
                             "Megatron one --norm-epsilon for all"),
        }
        n_group = int(hf_config.get("n_group") or 1)
        if n_group > 1:
            per_group = int(hf_config["num_experts_per_tok"]) / int(hf_config.get("topk_group") or 1)
            differs["num_experts_per_tok/topk_group"] = (
                per_group == 2, "transformers ranks groups by their top-2 scores, Megatron by top-k/group-topk")
        for key, (ok, why) in differs.items():
            if not ok:
                raise ConversionError(f"config.json: this {key} is not supported for deepseek3 ({why})")
        if self.q_lora_rank is None:
            raise ConversionError("config.json: q_lora_rank=null (no q compression) is not supported")
        self.q_lora_rank = int(self.q_lora_rank)

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_dense and layer % self.moe_freq == 0

    def check_layout(self, layout: Layout) -> None:
        super().check_layout(layout)
        tp = layout.tp
        self.divisible(self.heads, "num_attention_heads", tp)
        self.divisible(self.q_lora_rank, "q_lora_rank", tp)
        self.divisible(self.kv_lora_rank + self.rope_dim, "kv_lora_rank + qk_rope_head_dim", tp)
        self.divisible(self.ffn, "intermediate_size", tp)
        self.divisible(self.moe_ffn, "moe_intermediate_size", layout.expert_tp)
        if self.shared_ffn:
            self.divisible(self.shared_ffn, "moe_intermediate_size * n_shared_experts", tp)
        if self.mtp_layers:
            self.divisible(self.hidden, "hidden_size (MTP eh_proj)", tp)

    def layer_params(self, prefix, hf_prefix, layer, place):
        attn, mlp = hf_prefix + "self_attn.", hf_prefix + "mlp."

        def p(name, hf, rule=None, parallel=None, expert=None):
            param = Param(prefix + name, tuple(hf), parallel=parallel, place=place, layer=layer, expert=expert)
            if rule is not None:
                param.rule = rule
            return param

        col, row = Split(0), Split(1)
        out = [
            p("input_layernorm.weight", [hf_prefix + "input_layernorm.weight"]),
            p("self_attention.linear_q_down_proj.weight", [attn + "q_a_proj.weight"], col, "tp"),
            p("self_attention.q_layernorm.weight", [attn + "q_a_layernorm.weight"]),
            p("self_attention.linear_q_up_proj.weight", [attn + "q_b_proj.weight"], col, "tp"),
            p("self_attention.linear_kv_down_proj.weight", [attn + "kv_a_proj_with_mqa.weight"], col, "tp"),
            p("self_attention.kv_layernorm.weight", [attn + "kv_a_layernorm.weight"]),
            p("self_attention.linear_kv_up_proj.weight", [attn + "kv_b_proj.weight"], col, "tp"),
            p("self_attention.linear_proj.weight", [attn + "o_proj.weight"], row, "tp"),
            p("pre_mlp_layernorm.weight", [hf_prefix + "post_attention_layernorm.weight"]),
        ]
        # MTP layers follow the last decoder layer's kind (MoE in DeepSeek-V3).
        moe = self.is_moe(layer if place == "layer" else self.num_layers - 1)
        if not moe:
            return out + [
                p("mlp.linear_fc1.weight", [mlp + "gate_proj.weight", mlp + "up_proj.weight"], GateUp(), "tp"),
                p("mlp.linear_fc2.weight", [mlp + "down_proj.weight"], row, "tp"),
            ]
        out += [
            p("mlp.router.weight", [mlp + "gate.weight"]),
            p("mlp.router.expert_bias", [mlp + "gate.e_score_correction_bias"]),
        ]
        for e in range(self.num_experts):
            hf_e = f"{mlp}experts.{e}."
            out += [
                p("mlp.experts.local_experts.{expert}.linear_fc1.weight",
                  [hf_e + "gate_proj.weight", hf_e + "up_proj.weight"], GateUp(), "etp", e),
                p("mlp.experts.local_experts.{expert}.linear_fc2.weight", [hf_e + "down_proj.weight"], row, "etp", e),
            ]
        if self.shared_ffn:
            out += [
                p("mlp.shared_experts.linear_fc1.weight",
                  [mlp + "shared_experts.gate_proj.weight", mlp + "shared_experts.up_proj.weight"], GateUp(), "tp"),
                p("mlp.shared_experts.linear_fc2.weight", [mlp + "shared_experts.down_proj.weight"], row, "tp"),
            ]
        return out

    def mtp_params(self, depth, vocab):
        hf_prefix = f"model.layers.{self.num_layers + depth}."
        prefix = "mtp.layers.{layer}."

        def p(name, hf, rule=None, parallel=None):
            param = Param(prefix + name, (hf_prefix + hf,), parallel=parallel, place="mtp", layer=depth)
            if rule is not None:
                param.rule = rule
            return param

        out = [
            # Copies of the main embedding and output layer: checked, not stored; exported as copies.
            Param(EMBEDDING, (hf_prefix + "embed_tokens.weight",), vocab, "tp", "first",
                  to_megatron=False, same_as=HF_EMBEDDING),
            p("enorm.weight", "enorm.weight"),
            p("hnorm.weight", "hnorm.weight"),
            p("eh_proj.weight", "eh_proj.weight", Split(0), "tp"),
        ]
        out += self.layer_params(prefix + "mtp_model_layer.", hf_prefix, depth, "mtp")
        out += [
            p("final_layernorm.weight", "shared_head.norm.weight"),
            Param(OUTPUT, (hf_prefix + "shared_head.head.weight",), vocab, "tp", "last",
                  to_megatron=False, same_as=HF_OUTPUT),
        ]
        return out
