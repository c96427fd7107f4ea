"""Which HF tensors make which Megatron parameter, and where Megatron keeps it.

A :class:`Param` names one parameter of Megatron's local-spec GPTModel with global
indices (``{layer}``: decoder layer or MTP depth, ``{expert}``: routed expert), the HF
tensors it is made of, the rule that splits it over tensor parallel ranks, and its
pipeline placement. :class:`ModelMapping` lists a model's params and places them on a
:class:`~adaptor.convert.layout.Layout` (pipeline stage, local layer and expert indices).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import Layout, Replicated, VocabSplit

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
HF_EMBEDDING = "model.embed_tokens.weight"
HF_OUTPUT = "lm_head.weight"


@dataclass
class Param:
    megatron: str                  # with {layer} / {expert} placeholders
    hf: tuple[str, ...]
    rule: object = field(default_factory=Replicated)
    parallel: str | None = None    # "tp", "etp" (expert tensor parallel) or None (replicated)
    place: str = "layer"           # "first", "last", "first+last" (embedding with MTP), "layer", "mtp"
    layer: int | None = None       # decoder layer, or MTP depth for place == "mtp"
    expert: int | None = None
    to_megatron: bool = True       # False: an HF copy Megatron does not hold (MTP embed/head)
    to_hf: bool = True             # False: a Megatron copy HF does not hold (tied output on the last stage)
    same_as: str | None = None     # an HF tensor that must equal hf[0] (HF copies Megatron shares)


class ModelMapping:
    """A model's params (HF order) and their placement; subclasses fill in the architecture."""

    model_type = ""
    has_mtp_embedding = False

    def __init__(self, hf_config: dict):
        self.config = hf_config
        self.num_layers = int(self.require("num_hidden_layers"))
        self.vocab_size = int(self.require("vocab_size"))
        self.tied = bool(hf_config.get("tie_word_embeddings", False))
        self.mtp_layers = 0
        self.num_experts = 0

    def require(self, key: str):
        if self.config.get(key) is None:
            raise ConversionError(f"config.json: no value for '{key}' (needed for {self.model_type})")
        return self.config[key]

    # -- subclasses --------------------------------------------------------------------------
    def for_checkpoint(self, hf) -> ModelMapping:
        """The mapping that reads the tensors of ``hf`` (a family may read more than one layout; it writes one)."""
        return self

    def layer_params(self, prefix: str, hf_prefix: str, layer: int, place: str) -> list[Param]:
        raise NotImplementedError

    def check_layout(self, layout: Layout) -> None:
        """Raise ConversionError naming the setting that `layout` cannot split."""
        if self.num_layers % layout.stages:
            virtual = f" x {layout.vpp} virtual stages" if layout.vpp > 1 else ""
            raise ConversionError(f"num_hidden_layers={self.num_layers} is not divisible by "
                                  f"--target-pipeline-parallel-size {layout.pp}{virtual}")
        if layout.ep > 1 and (self.num_experts == 0 or self.num_experts % layout.ep):
            raise ConversionError(f"{self.num_experts} routed experts are not divisible by "
                                  f"--target-expert-parallel-size {layout.ep}")
        if layout.etp not in (None, 1, layout.tp):
            raise ConversionError(f"expert tensor parallel size {layout.etp} must be 1 or the tensor parallel size")

    @staticmethod
    def divisible(value: int, what: str, size: int, flag: str = "--target-tensor-parallel-size") -> None:
        if value % size:
            raise ConversionError(f"{what}={value} is not divisible by {flag} {size}")

    # -- shared structure --------------------------------------------------------------------
    def params(self, padded_vocab: int) -> list[Param]:
        vocab = VocabSplit(self.vocab_size, padded_vocab)
        embed_place = "first+last" if self.has_mtp_embedding and self.mtp_layers else "first"
        out = [Param(EMBEDDING, (HF_EMBEDDING,), vocab, "tp", embed_place)]
        for i in range(self.num_layers):
            out += self.layer_params(f"decoder.layers.{{layer}}.", f"model.layers.{i}.", i, "layer")
        for k in range(self.mtp_layers):
            out += self.mtp_params(k, vocab)
        out.append(Param(FINAL_NORM, ("model.norm.weight",), place="last"))
        if self.tied:
            # Megatron keeps a copy of the embedding as output layer on the last stage when PP > 1.
            out.append(Param(OUTPUT, (HF_EMBEDDING,), vocab, "tp", "last+pp", to_hf=False))
        else:
            out.append(Param(OUTPUT, (HF_OUTPUT,), vocab, "tp", "last"))
        return out

    def mtp_params(self, depth: int, vocab) -> list[Param]:
        return []

    # -- placement ---------------------------------------------------------------------------
    def stage_of(self, param: Param, layout: Layout) -> list[int]:
        """The stages (runs of layers, :attr:`Layout.stages`) that hold ``param``."""
        last = layout.stages - 1
        if param.place == "layer":
            return [param.layer // (self.num_layers // layout.stages)]
        if param.place == "first":
            return [0]
        if param.place == "first+last":
            return sorted({0, last})
        if param.place == "last+pp":
            return [last] if layout.stages > 1 else []
        return [last]  # "last", "mtp"

    def local_name(self, param: Param, layout: Layout) -> str:
        layer = param.layer
        if param.place == "layer":
            layer = param.layer % (self.num_layers // layout.stages)
        expert = None
        if param.expert is not None:
            expert = param.expert % (self.num_experts // layout.ep)
        return param.megatron.format(layer=layer, expert=expert)

    def ep_rank_of(self, param: Param, layout: Layout) -> int | None:
        """The EP rank holding a routed expert; None for parameters every EP rank holds."""
        if param.expert is None:
            return None
        return param.expert // (self.num_experts // layout.ep)


def extra_state_names(names: list[str], stage: int, layout: Layout, tied: bool) -> list[str]:
    """The ``_extra_state`` entries (None) of the linear layers among `names` (those of ``stage``,
    :meth:`Layout.stage`), as Megatron saves them."""
    extra = []
    for name in names:
        module, _, leaf = name.rpartition(".")
        last = module.rpartition(".")[2]
        if leaf == "weight" and (last.startswith("linear_") or last in ("eh_proj", "output_layer")):
            extra.append(module + "._extra_state")
    if tied and layout.stages == 1 and stage == 0:
        extra.append("output_layer._extra_state")  # the tied output layer keeps its extra state
    return extra

