"""CLIP and SigLIP vision towers (transformers' CLIPVisionModel / SiglipVisionModel) <-> megatron-core's CLIPViTModel.

Megatron's tower (local ViT spec) and the HF tensors it is made of, per layer ``i``:

==============================================  =================================================
``conv1.weight`` (+ ``conv1.bias``, SigLIP)       ``embeddings.patch_embedding.weight`` (+ bias)
``class_token`` [1, 1, h] (CLIP)                  ``embeddings.class_embedding`` [h]
``position_embeddings.weight``                    ``embeddings.position_embedding.weight``
``ln_pre`` (CLIP) / ``ln_post`` (SigLIP)          ``pre_layrnorm`` / ``post_layernorm``
``decoder.layers.i.input_layernorm``              ``encoder.layers.i.layer_norm1``
``...self_attention.linear_qkv`` (weight, bias)   ``q_proj``, ``k_proj``, ``v_proj``: per head [q; k; v]
``...self_attention.linear_proj``                 ``self_attn.out_proj``
``...pre_mlp_layernorm``                          ``encoder.layers.i.layer_norm2``
``...mlp.linear_fc1`` / ``linear_fc2``            ``mlp.fc1`` / ``mlp.fc2``
==============================================  =================================================

HF names with or without ``vision_model.`` (transformers 4 / 5). TP splits QKV heads and fc1 rows
(with biases) and the input columns of ``linear_proj``/``fc2``. CLIP's ``post_layernorm`` (pooler
only) is not part of Megatron's tower; a shorter tower takes the first layers; a full CLIP/SigLIP
directory works, its text tensors unread.
"""
from __future__ import annotations

from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import GroupedQKV, Layout, Replicated, Split
from adaptor.convert.mapping import ModelMapping, Param

PREFIX = "vision_model."
HF_ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_new": "gelu_tanh"}


class Reshape:
    """A tensor Megatron keeps in another shape (CLIP's class token: [h] in HF, [1, 1, h] in Megatron)."""

    def __init__(self, megatron_shape: tuple, hf_shape: tuple):
        self.megatron_shape, self.hf_shape = megatron_shape, hf_shape

    def shard(self, hf, rank, size):
        return hf[0].reshape(self.megatron_shape)

    def merge(self, parts):
        return [parts[0].reshape(self.hf_shape)]


def vision_config(hf_config: dict) -> dict:
    """The vision part of a config.json: itself for a vision model, ``vision_config`` for a full model."""
    return hf_config["vision_config"] if isinstance(hf_config.get("vision_config"), dict) else hf_config


class ClipVisionMapping(ModelMapping):
    model_type = "clip_vision"
    hf_model_types = ("clip_vision_model", "clip")

    def __init__(self, hf_config: dict, num_layers: int | None = None, prefix: str = PREFIX):
        self.config = vision_config(hf_config)
        self.prefix = prefix
        self.hidden = int(self.require("hidden_size"))
        self.heads = int(self.require("num_attention_heads"))
        self.ffn = int(self.require("intermediate_size"))
        self.layers_in_checkpoint = int(self.require("num_hidden_layers"))
        self.num_layers = self.layers_in_checkpoint if num_layers is None else num_layers
        if self.num_layers > self.layers_in_checkpoint:
            raise ConversionError(f"the tower has {self.num_layers} layers but the checkpoint only "
                                  f"{self.layers_in_checkpoint}")
        if self.hidden % self.heads:
            raise ConversionError(f"config.json: hidden_size={self.hidden} is not divisible by "
                                  f"num_attention_heads={self.heads}")
        self.vocab_size, self.tied, self.mtp_layers, self.num_experts = 0, False, 0, 0

    def check_layout(self, layout: Layout) -> None:
        if layout.pp != 1 or layout.ep != 1:
            raise ConversionError("a vision tower is converted for tensor parallelism only")
        self.divisible(self.heads, "num_attention_heads", layout.tp, "--tensor-model-parallel-size")
        self.divisible(self.ffn, "intermediate_size", layout.tp, "--tensor-model-parallel-size")

    def embedding_params(self) -> list[Param]:
        e = self.prefix + "embeddings."
        return [
            Param("class_token", (e + "class_embedding",), Reshape((1, 1, self.hidden), (self.hidden,)), place="first"),
            Param("conv1.weight", (e + "patch_embedding.weight",), place="first"),
            Param("position_embeddings.weight", (e + "position_embedding.weight",), place="first"),
            Param("ln_pre.weight", (self.prefix + "pre_layrnorm.weight",), place="first"),
            Param("ln_pre.bias", (self.prefix + "pre_layrnorm.bias",), place="first"),
        ]

    def final_params(self) -> list[Param]:
        return []

    def params(self, padded_vocab: int = 0) -> list[Param]:
        out = self.embedding_params()
        for i in range(self.num_layers):
            out += self.layer_params("decoder.layers.{layer}.", f"{self.prefix}encoder.layers.{i}.", i, "layer")
        return out + self.final_params()

    def layer_params(self, prefix, hf_prefix, layer, place):
        attn, mlp = hf_prefix + "self_attn.", hf_prefix + "mlp."
        qkv = GroupedQKV(self.heads, self.heads, self.hidden // self.heads)

        def p(name, hf, rule=None, parallel=None):
            return Param(prefix + name, tuple(hf), rule or Replicated(), parallel, place, layer)

        return [
            p("input_layernorm.weight", [hf_prefix + "layer_norm1.weight"]),
            p("input_layernorm.bias", [hf_prefix + "layer_norm1.bias"]),
            p("self_attention.linear_qkv.weight", [attn + f"{x}_proj.weight" for x in "qkv"], qkv, "tp"),
            p("self_attention.linear_qkv.bias", [attn + f"{x}_proj.bias" for x in "qkv"], qkv, "tp"),
            p("self_attention.linear_proj.weight", [attn + "out_proj.weight"], Split(1), "tp"),
            p("self_attention.linear_proj.bias", [attn + "out_proj.bias"]),
            p("pre_mlp_layernorm.weight", [hf_prefix + "layer_norm2.weight"]),
            p("pre_mlp_layernorm.bias", [hf_prefix + "layer_norm2.bias"]),
            p("mlp.linear_fc1.weight", [mlp + "fc1.weight"], Split(0), "tp"),
            p("mlp.linear_fc1.bias", [mlp + "fc1.bias"], Split(0), "tp"),
            p("mlp.linear_fc2.weight", [mlp + "fc2.weight"], Split(1), "tp"),
            p("mlp.linear_fc2.bias", [mlp + "fc2.bias"]),
        ]

    def model_json_values(self) -> dict:
        """model.json vision_encoder keys as the checkpoint describes them (num_layers: at most)."""
        act = self.config.get("hidden_act", "quick_gelu")
        return {
            "hidden_size": self.hidden, "ffn_hidden_size": self.ffn, "num_attention_heads": self.heads,
            "patch_size": int(self.require("patch_size")), "image_size": int(self.require("image_size")),
            "layernorm_epsilon": float(self.config.get("layer_norm_eps", 1e-5)),
            "activation_func": HF_ACTIVATIONS.get(act, act),
        }


class SiglipVisionMapping(ClipVisionMapping):
    """SigLIP: no class token, a patch-embedding bias, a final ``post_layernorm`` (Megatron's ``ln_post``)."""

    model_type = "siglip_vision"
    hf_model_types = ("siglip_vision_model", "siglip")

    def embedding_params(self) -> list[Param]:
        e = self.prefix + "embeddings."
        return [
            Param("conv1.weight", (e + "patch_embedding.weight",), place="first"),
            Param("conv1.bias", (e + "patch_embedding.bias",), place="first"),
            Param("position_embeddings.weight", (e + "position_embedding.weight",), place="first"),
        ]

    def final_params(self) -> list[Param]:
        return [Param("ln_post.weight", (self.prefix + "post_layernorm.weight",), place="first"),
                Param("ln_post.bias", (self.prefix + "post_layernorm.bias",), place="first")]

    def model_json_values(self) -> dict:
        values = super().model_json_values()
        values["layernorm_epsilon"] = float(self.config.get("layer_norm_eps", 1e-6))
        return values


def tensor_prefix(names) -> str:
    """``vision_model.`` or ``""``: where the checkpoint keeps the tower's tensors."""
    names = set(names)
    for prefix in (PREFIX, ""):
        if prefix + "embeddings.patch_embedding.weight" in names:
            return prefix
    raise ConversionError("no embeddings.patch_embedding.weight (nor vision_model.embeddings...): not a CLIP or "
                          "SigLIP vision checkpoint")


def vision_mapping(model_id: str, hf_config: dict, num_layers: int | None = None, names=None) -> ClipVisionMapping:
    """The mapping for model.json's vision_encoder model_id ("clip" or "siglip"); config.json must agree.
    ``names``: the checkpoint's tensor names, to find their prefix (default ``vision_model.``)."""
    cls = {"clip": ClipVisionMapping, "siglip": SiglipVisionMapping}[model_id]
    found = hf_config.get("model_type")
    if found not in cls.hf_model_types:
        raise ConversionError(f"config.json has model_type {found!r}, not a {model_id} vision model "
                              f"({' or '.join(cls.hf_model_types)})")
    return cls(hf_config, num_layers, PREFIX if names is None else tensor_prefix(names))
