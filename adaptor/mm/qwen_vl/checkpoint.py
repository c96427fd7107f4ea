"""The whole :class:`~adaptor.mm.qwen_vl.model.QwenVLModel` from a Hugging Face directory and back, at any TP/PP.

A rank's tensors are the decoder's (:mod:`adaptor.mm.qwen_vl.text_weights`, under ``language_model.``) and,
on the first pipeline stage, the tower's (:mod:`adaptor.mm.qwen_vl.weights`, under ``vision_model.``).
Back to Hugging Face, the ranks' states are joined (tensor-parallel slices concatenated the way they were
cut) and named as the checkpoint they came from names them (``like``), or as transformers saves them.
Every step is a slice, a concatenation, a reshape or a permutation: HF -> ranks -> HF is bit-exact.
"""
from __future__ import annotations

from pathlib import Path

import torch

from adaptor.convert.layout import Layout
from adaptor.mm.qwen_vl import weights as vision_weights
from adaptor.mm.qwen_vl.settings import VisionSettings

TEXT, VISION = "language_model.", "vision_model."


def _vision_settings(hf_config: dict) -> VisionSettings:
    return VisionSettings.from_hf(hf_config["model_type"], hf_config["vision_config"])


def rank_tensors(hf, layout: Layout, tp_rank: int = 0, pp_rank: int = 0, *, padded_vocab_size: int):
    """(name, tensor) of rank (``tp_rank``, ``pp_rank``) of the model, from ``hf`` (an ``HfCheckpoint``)."""
    from adaptor.mm.qwen_vl.text_weights import text_decoder_tensors

    for name, tensor in text_decoder_tensors(hf, layout, tp_rank, pp_rank, padded_vocab_size=padded_vocab_size):
        yield TEXT + name, tensor
    if pp_rank == 0:
        prefix = vision_weights.vision_prefix(hf.names())
        state = {n: hf.get(n) for n in hf.names() if n.startswith(prefix)}
        for name, tensor in vision_weights.from_hf(state, _vision_settings(hf.config), layout.tp, tp_rank).items():
            yield VISION + name, tensor


def load_hf_into(model, hf, layout: Layout, tp_rank: int, pp_rank: int) -> int:
    """Copy this rank's tensors of ``hf`` into ``model`` (a QwenVLModel); every parameter must receive one."""
    from adaptor.convert.online import copy_into

    padded = model.language_model.vocab_size
    return copy_into(model, rank_tensors(hf, layout, tp_rank, pp_rank, padded_vocab_size=padded), "Qwen-VL model")


def _join(parts: list[torch.Tensor], kind: str) -> torch.Tensor:
    """The inverse of the tower's tensor-parallel cut (:func:`adaptor.mm.qwen_vl.weights._shard`)."""
    if len(parts) == 1 or kind == "replicated":
        return parts[0]
    if kind == "glu":
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(parts, dim=0 if kind == "column" else 1)


def hf_state(states: dict, hf_config: dict, layout: Layout, *, padded_vocab_size: int, like=None) -> dict:
    """Hugging Face tensors from ``states[(tp_rank, pp_rank)]`` (each rank's model state dict). ``like``: an
    ``HfCheckpoint`` whose naming to follow (the published Qwen2.5-VL's ``model.``/``visual.``, or transformers')."""
    from adaptor.convert.tensors import hf_tensors_from_megatron
    from adaptor.mm.qwen_vl.text_weights import text_mapping

    mapping = text_mapping(hf_config)
    if like is not None:
        mapping = mapping.for_checkpoint(like)
    out = dict(hf_tensors_from_megatron(lambda key, name: states[(key[0], key[1])][TEXT + name], mapping,
                                        hf_config, layout, padded_vocab_size=padded_vocab_size))
    settings = _vision_settings(hf_config)
    whole = {rule.ours: _join([states[(t, 0)][VISION + rule.ours] for t in range(layout.tp)], rule.shard)
             for rule in vision_weights.rules(settings)}
    prefix = vision_weights.vision_prefix(like.names()) if like is not None else "model.visual."
    out.update(vision_weights.to_hf(whole, settings, prefix))
    return out


def save_tensors(tensors: dict, hf_config: dict, out_dir) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (``tensors``: Hugging Face names) to ``out_dir``."""
    import json

    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    return out


def checkpoint_layout(iteration_dir) -> Layout:
    """TP and PP sizes of a Megatron iteration directory, from its ``mp_rank_TT[_PPP]`` names."""
    import re

    names = [p.name for p in Path(iteration_dir).glob("mp_rank_*") if p.is_dir()]
    found = [re.fullmatch(r"mp_rank_(\d{2})(?:_(\d{3}))?", n) for n in names]
    if not names or not all(found):
        raise ValueError(f"{iteration_dir}: expected mp_rank_TT or mp_rank_TT_PPP directories, found "
                         f"{sorted(names)[:3] or 'none'}")
    tps = {int(m.group(1)) for m in found}
    pps = {int(m.group(2) or 0) for m in found}
    if len(names) != len(tps) * len(pps):
        raise ValueError(f"{iteration_dir}: {len(names)} rank directories for TP {len(tps)} x PP {len(pps)}")
    return Layout(tp=len(tps), pp=len(pps))


def hf_state_from_checkpoint(iteration_dir, hf_config: dict, like=None) -> dict:
    """:func:`hf_state` of the rank files of a pretrain_mm.py checkpoint's iteration directory."""
    from adaptor.convert.torch_legacy import RankStates

    layout = checkpoint_layout(iteration_dir)
    ranks = RankStates(iteration_dir, layout)
    states = {(t, p): ranks.state((t, p, 0)) for t in range(layout.tp) for p in range(layout.pp)}
    padded = states[(0, 0)][TEXT + "embedding.word_embeddings.weight"].shape[0] * layout.tp
    return hf_state(states, hf_config, layout, padded_vocab_size=padded, like=like)
