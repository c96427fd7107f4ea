"""Megatron <-> Hugging Face tensors, one at a time, at any TP/PP/EP layout.

The same functions run twice: on meta tensors (shapes and dtypes only, so writers can write file
headers first) and on real ones (memory-mapped inputs, one output tensor alive at a time). Apart
from :mod:`adaptor.convert.offline` so that the HF writer and LoRA can use them without it.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from adaptor.convert.errors import ConversionError
from adaptor.convert.hf_directory import HfCheckpoint
from adaptor.convert.layout import Layout, padded_vocab_size as default_padded_vocab
from adaptor.convert.mapping import ModelMapping, Param
from adaptor.convert.models import model_mapping


def _mapping(model_type, hf_config) -> ModelMapping:
    return model_type if isinstance(model_type, ModelMapping) else model_mapping(model_type, hf_config)


def _parallel(param: Param, layout: Layout, tp_rank: int) -> tuple[int, int]:
    """(rank, size) of the split `param` follows on tensor rank `tp_rank`."""
    if param.parallel == "tp":
        return tp_rank, layout.tp
    if param.parallel == "etp" and layout.expert_tp > 1:
        return tp_rank, layout.expert_tp
    return 0, 1


def _rank_params(mapping: ModelMapping, layout: Layout, stage: int, ep_rank: int, padded: int):
    for param in mapping.params(padded):
        if not param.to_megatron or stage not in mapping.stage_of(param, layout):
            continue
        owner = mapping.ep_rank_of(param, layout)
        if owner is not None and owner != ep_rank:
            continue
        yield mapping.local_name(param, layout), param


def _shard(param: Param, tensors: list[torch.Tensor], rank: int, size: int) -> torch.Tensor:
    try:
        return param.rule.shard(tensors, rank, size)
    except RuntimeError as exc:
        shapes = ", ".join(f"{n} {list(t.shape)}" for n, t in zip(param.hf, tensors))
        raise ConversionError(f"tensors {shapes} do not fit config.json ({str(exc).splitlines()[0]})") from None


def megatron_rank_tensors(hf: HfCheckpoint, model_type, layout: Layout, tp_rank: int = 0, pp_rank: int = 0,
                          ep_rank: int = 0, *, vp_stage: int = 0, padded_vocab_size: int | None = None,
                          make_vocab_size_divisible_by: int = 128, meta: bool = False
                          ) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of rank (tp_rank, pp_rank, ep_rank) of Megatron's local-spec GPTModel, as HF views:
    those of its model chunk `vp_stage` when the layout has virtual pipeline stages.

    `meta=True` yields meta tensors (shapes and dtypes from the safetensors headers only).
    """
    mapping = _mapping(model_type, hf.config).for_checkpoint(hf)
    padded = padded_vocab_size or default_padded_vocab(mapping.vocab_size, layout.tp, make_vocab_size_divisible_by)
    get = hf.get_meta if meta else hf.get
    for name, param in _rank_params(mapping, layout, layout.stage(pp_rank, vp_stage), ep_rank, padded):
        rank, size = _parallel(param, layout, tp_rank)
        tensor = _shard(param, [get(n) for n in param.hf], rank, size)
        if not meta:  # pages of the inputs: dropped now, re-read if `tensor` is a view of them
            for hf_name in param.hf:
                hf.release(hf_name)
        yield name, tensor
        del tensor
        if not meta:  # and again once written, for the views
            for hf_name in param.hf:
                hf.release(hf_name)


def hf_tensors_from_megatron(get: Callable[[tuple[int, int, int], str], torch.Tensor], model_type, hf_config: dict,
                             layout: Layout, *, padded_vocab_size: int,
                             release: Callable[[tuple[int, int, int], str], None] | None = None
                             ) -> Iterator[tuple[str, torch.Tensor]]:
    """HF tensors one at a time; `get((tp_rank, stage, ep_rank), megatron_name)` reads a rank's tensor (`stage`:
    :meth:`Layout.stage`, the pipeline rank without virtual stages), `release(key, name)` (optional) is called
    once the tensors made from it were consumed."""
    mapping = _mapping(model_type, hf_config)
    for param in mapping.params(padded_vocab_size):
        if not param.to_hf:
            continue
        stage = mapping.stage_of(param, layout)[0]
        ep_rank = mapping.ep_rank_of(param, layout) or 0
        name = mapping.local_name(param, layout)
        _, size = _parallel(param, layout, 0)
        parts = [get((t, stage, ep_rank), name) for t in range(size)]
        merged = param.rule.merge(parts)
        del parts
        if release is not None:  # pages of the parts: dropped now, re-read if `merged` is a view of them
            for t in range(size):
                release((t, stage, ep_rank), name)
        for hf_name, tensor in zip(param.hf, merged):
            yield hf_name, tensor
        del merged
        if release is not None:  # and again once written, for the views
            for t in range(size):
                release((t, stage, ep_rank), name)
