"""Mixtral: GQA attention without q/k norms, every layer a MoE of SwiGLU experts (``w1`` gate, ``w3`` up,
``w2`` down, each ``intermediate_size``) under ``block_sparse_moe``, no shared experts.

The router is a softmax over all experts, top-k, renormalised: Megatron's softmax over the top-k
logits. Refused: ``router_jitter_noise`` (transformers multiplies the training inputs by noise Megatron
does not draw) and a sliding window (Megatron's attention here is full causal).
"""
from __future__ import annotations

from adaptor.convert.errors import ConversionError
from adaptor.convert.qwen3_moe import Qwen3MoeMapping


class MixtralMapping(Qwen3MoeMapping):
    model_type = "mixtral"
    experts_key = "num_local_experts"
    qk_norm = False
    moe_prefix = "block_sparse_moe."
    expert_names = ("w1", "w3", "w2")

    def moe_ffn_size(self):
        return self.require("intermediate_size")

    def moe_ffn_key(self) -> str:
        return "intermediate_size"

    def norm_topk(self) -> bool:
        return True

    def refuse_unsupported(self) -> None:
        c = self.config
        if float(c.get("router_jitter_noise") or 0.0) != 0.0:
            raise ConversionError(f"config.json: router_jitter_noise={c['router_jitter_noise']} is not supported for "
                                  f"mixtral (Megatron's router does not multiply its inputs by noise); set it to 0")
        if c.get("sliding_window") is not None:
            raise ConversionError(f"config.json: sliding_window={c['sliding_window']} is not supported for mixtral "
                                  f"(Megatron's attention here is full causal); it must be null")
        for key in ("mlp_only_layers", "decoder_sparse_step"):
            if c.get(key) not in (None, [], 1):
                raise ConversionError(f"config.json: {key} is not a mixtral setting (every layer is MoE)")
        super().refuse_unsupported()
