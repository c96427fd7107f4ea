"""The text decoder's weights from a Qwen2.5-VL / Qwen3-VL Hugging Face checkpoint.

The decoder layers are Qwen2.5's (q/k/v bias) and Qwen3's (q/k RMSNorm), so the mappings are those of
:mod:`adaptor.convert.qwen2` and :mod:`adaptor.convert.qwen3` with the Hugging Face names moved under the
VL model's text prefix: ``model.language_model.`` as transformers 5 saves them, or ``model.`` as the
published Qwen2.5-VL checkpoints keep them (chosen from the checkpoint's names). ``lm_head.weight``
stays at the top. Vision tensors are not read here.
"""
from __future__ import annotations

import dataclasses

from adaptor.convert.layout import Layout
from adaptor.convert.mapping import ModelMapping
from adaptor.convert.qwen2 import Qwen2Mapping
from adaptor.convert.qwen3 import Qwen3Mapping
from adaptor.mm.qwen_vl.text_config import VlTextConfig, vl_text_config

TRANSFORMERS_PREFIX = "model.language_model."
PUBLISHED_PREFIX = "model."


class _VlText:
    """Moves the base mapping's ``model.*`` names under ``text_prefix``; ``config`` is the flat text config
    the base mapping reads, ``vl_config`` the VL model's."""

    text_prefix = TRANSFORMERS_PREFIX

    def for_checkpoint(self, hf) -> ModelMapping:
        names = set(hf.names())
        if f"{TRANSFORMERS_PREFIX}embed_tokens.weight" in names or f"{PUBLISHED_PREFIX}embed_tokens.weight" not in names:
            return self
        published = type(self)(self.vl_config)
        published.text_prefix = PUBLISHED_PREFIX
        return published

    def _hf_name(self, name: str) -> str:
        return self.text_prefix + name[len("model."):] if name.startswith("model.") else name

    def params(self, padded_vocab: int):
        return [dataclasses.replace(p, hf=tuple(self._hf_name(n) for n in p.hf),
                                    same_as=None if p.same_as is None else self._hf_name(p.same_as))
                for p in super().params(padded_vocab)]


class Qwen2_5VlTextMapping(_VlText, Qwen2Mapping):
    model_type = "qwen2_5_vl"

    def __init__(self, hf_config: dict):
        super().__init__(_flat(hf_config, "qwen2"))
        self.vl_config = hf_config


class Qwen3VlTextMapping(_VlText, Qwen3Mapping):
    model_type = "qwen3_vl"

    def __init__(self, hf_config: dict):
        super().__init__(_flat(hf_config, "qwen3"))
        self.vl_config = hf_config


def _flat(hf_config: dict, base: str) -> dict:
    return vl_text_config(hf_config).flat_hf_config(base)


MAPPINGS = {"qwen2_5_vl": Qwen2_5VlTextMapping, "qwen3_vl": Qwen3VlTextMapping}


def text_mapping(hf_config: dict) -> ModelMapping:
    """The mapping of the decoder of ``hf_config`` (a VL config dict)."""
    text: VlTextConfig = vl_text_config(hf_config)
    return MAPPINGS[text.family](hf_config)


def text_decoder_tensors(hf, layout: Layout | None = None, tp_rank: int = 0, pp_rank: int = 0, *,
                         padded_vocab_size: int | None = None):
    """(name, tensor) of rank (``tp_rank``, ``pp_rank``) of the decoder ``GPTModel`` on ``layout``, from ``hf``
    (an :class:`adaptor.convert.HfCheckpoint` of a VL model)."""
    from adaptor.convert.tensors import megatron_rank_tensors

    layout = layout or Layout()
    mapping = text_mapping(hf.config)
    mapping.check_layout(layout)
    return megatron_rank_tensors(hf, mapping, layout, tp_rank, pp_rank, padded_vocab_size=padded_vocab_size)
