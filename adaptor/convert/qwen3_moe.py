"""Qwen3-MoE: Qwen3's attention (GQA, q/k RMSNorm), routed SwiGLU experts without shared experts.

A decoder layer is MoE unless it is in ``mlp_only_layers`` or ``(layer + 1) % decoder_sparse_step``
is non-zero (transformers' Qwen3MoeDecoderLayer); the other layers are dense SwiGLU MLPs of
``intermediate_size``. The router is a softmax over all experts then top-k; ``norm_topk_prob``
renormalises the k weights, which is Megatron's softmax over the top-k logits (its default), and
without it the weights are the plain probabilities (``--moe-router-pre-softmax``).

Hub checkpoints, and transformers' ``save_pretrained`` (which folds its in-memory 3-D
``experts.gate_up_proj`` / ``experts.down_proj`` back), hold one ``gate_proj`` / ``up_proj`` /
``down_proj`` per expert; that is the layout written here. transformers' own layout
(``save_pretrained(save_original_format=False)``: ``mlp.gate`` and, per layer, ``mlp.experts.gate_up_proj``
[experts, 2 x ffn, hidden] with gate rows first and ``mlp.experts.down_proj`` [experts, hidden, ffn]) is
read too.
"""
from __future__ import annotations

import copy

from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import GateUp, Split
from adaptor.convert.mapping import Param
from adaptor.convert.qwen3 import Qwen3Mapping


class FusedExpert:
    """One expert's part of transformers' 3-D expert tensor: its ``gate_up_proj`` rows as a SwiGLU linear_fc1
    (split as :class:`GateUp`), or its ``down_proj`` (split as row parallel). Read only: exports are per expert."""

    def __init__(self, expert: int, experts: int, gate_up: bool):
        self.expert, self.experts, self.gate_up = expert, experts, gate_up

    def shard(self, hf, rank, size):
        if hf[0].dim() != 3 or hf[0].shape[0] != self.experts:
            raise RuntimeError(f"not [{self.experts} experts, ...]")
        weight = hf[0][self.expert]
        if self.gate_up:
            return GateUp().shard(list(weight.chunk(2)), rank, size)
        return Split(1).shard([weight], rank, size)

    def merge(self, parts):
        raise ConversionError("internal: transformers' fused expert layout is read, not written")


class Qwen3MoeMapping(Qwen3Mapping):
    model_type = "qwen3-moe"
    experts_key = "num_experts"                                # config.json's expert count
    qk_norm = True
    moe_prefix = "mlp."                                        # the HF MoE block of a layer
    fused = False                                              # transformers' 3-D expert tensors
    expert_names = ("gate_proj", "up_proj", "down_proj")       # per expert: gate, up, down

    def __init__(self, hf_config: dict):
        super().__init__(hf_config)
        # transformers 5 writes Qwen3-MoE's count as num_local_experts, the Hub's configs as num_experts
        self.num_experts = int(hf_config.get(self.experts_key) or hf_config.get("num_local_experts") or 0)
        if self.num_experts <= 0:
            raise ConversionError(f"config.json: no value for '{self.experts_key}' (needed for {self.model_type})")
        self.topk = int(self.require("num_experts_per_tok"))
        self.moe_ffn = int(self.moe_ffn_size())
        self.sparse_step = int(hf_config.get("decoder_sparse_step") or 1)
        self.dense_layers = sorted(int(i) for i in hf_config.get("mlp_only_layers") or [])
        self.refuse_unsupported()

    def moe_ffn_size(self):
        return self.require("moe_intermediate_size")

    def norm_topk(self) -> bool:
        return bool(self.config.get("norm_topk_prob", False))

    def refuse_unsupported(self) -> None:
        """Settings of config.json under which transformers computes what this Megatron model does not."""
        c = self.config
        if c.get("use_sliding_window") and c.get("sliding_window") is not None:
            raise ConversionError(f"config.json: use_sliding_window=true (sliding_window={c['sliding_window']}) is "
                                  f"not supported for {self.model_type}; Megatron's attention here is full causal")
        if c.get("hidden_act", "silu") != "silu":
            raise ConversionError(f"config.json: hidden_act={c['hidden_act']!r} is not supported for "
                                  f"{self.model_type} (the MLP and experts are SwiGLU, silu)")
        if c.get("shared_expert_intermediate_size"):
            raise ConversionError(f"config.json: shared_expert_intermediate_size is not supported for "
                                  f"{self.model_type} (Qwen3-MoE has no shared expert)")
        if not 0 < self.topk <= self.num_experts:
            raise ConversionError(f"config.json: num_experts_per_tok={self.topk} must be between 1 and the "
                                  f"{self.num_experts} experts")
        if self.sparse_step < 1:
            raise ConversionError(f"config.json: decoder_sparse_step={self.sparse_step} must be at least 1")
        if not any(self.is_moe(i) for i in range(self.num_layers)):
            raise ConversionError("config.json: decoder_sparse_step and mlp_only_layers leave no MoE layer; "
                                  "convert it as the dense qwen3")

    def for_checkpoint(self, hf):
        first = next(i for i in range(self.num_layers) if self.is_moe(i))
        try:
            fused = f"model.layers.{first}.mlp.experts.gate_up_proj" in hf
        except TypeError:  # a source without a name index (a PEFT adapter)
            return self
        if not fused:
            return self
        mapping = copy.copy(self)
        mapping.fused = True
        return mapping

    def is_moe(self, layer: int) -> bool:
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0

    def moe_layer_freq(self) -> list[int]:
        return [1 if self.is_moe(i) else 0 for i in range(self.num_layers)]

    def check_layout(self, layout) -> None:
        super(Qwen3Mapping, self).check_layout(layout)  # layers by PP, experts by EP, expert TP 1 or TP
        self.divisible(self.groups, "num_key_value_heads (query groups)", layout.tp)
        self.divisible(self.heads, "num_attention_heads", layout.tp)
        if not all(self.moe_layer_freq()):
            self.divisible(self.ffn, "intermediate_size", layout.tp)
        self.divisible(self.moe_ffn, self.moe_ffn_key(), layout.expert_tp)

    def moe_ffn_key(self) -> str:
        return "moe_intermediate_size"

    def layer_params(self, prefix, hf_prefix, layer, place):
        params = super().layer_params(prefix, hf_prefix, layer, place)
        if not self.qk_norm:
            params = [p for p in params if not p.megatron.endswith(("q_layernorm.weight", "k_layernorm.weight"))]
        if not self.is_moe(layer):
            return params
        params = [p for p in params if ".mlp." not in p.megatron]
        moe = hf_prefix + ("mlp." if self.fused else self.moe_prefix)
        gate, up, down = self.expert_names

        def p(name, hf, rule=None, parallel=None, expert=None):
            param = Param(prefix + name, tuple(hf), parallel=parallel, place=place, layer=layer, expert=expert)
            if rule is not None:
                param.rule = rule
            return param

        fc1 = "mlp.experts.local_experts.{expert}.linear_fc1.weight"
        fc2 = "mlp.experts.local_experts.{expert}.linear_fc2.weight"
        params.append(p("mlp.router.weight", [moe + "gate.weight"]))
        for e in range(self.num_experts):
            if self.fused:
                params += [p(fc1, [moe + "experts.gate_up_proj"], FusedExpert(e, self.num_experts, True), "etp", e),
                           p(fc2, [moe + "experts.down_proj"], FusedExpert(e, self.num_experts, False), "etp", e)]
            else:
                hf_e = f"{moe}experts.{e}."
                params += [p(fc1, [hf_e + gate + ".weight", hf_e + up + ".weight"], GateUp(), "etp", e),
                           p(fc2, [hf_e + down + ".weight"], Split(1), "etp", e)]
        return params
