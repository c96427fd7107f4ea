"""Offline conversion of whole directories (tools/convert_ckpt.py, tools/safetensors_ckpt.py merge).

Hugging Face -> Megatron writes a release checkpoint (safetensors, or legacy torch rank files);
Megatron -> Hugging Face reads a checkpoint tensor by tensor (:class:`MegatronCheckpoint`) into the
one HF writer (:mod:`adaptor.convert.hf_writer`).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from adaptor.checkpoint.errors import CheckpointError
from adaptor.checkpoint.files import is_safetensors_checkpoint, staged_directory
from adaptor.convert.errors import ConversionError
from adaptor.convert.hf_directory import HfCheckpoint
from adaptor.convert.hf_writer import copy_side_files, write_hf_dir
from adaptor.convert.layout import Layout, padded_vocab_size as default_padded_vocab
from adaptor.convert.mapping import EMBEDDING, ModelMapping, extra_state_names
from adaptor.convert.models import model_mapping
from adaptor.convert.tensors import megatron_rank_tensors
from adaptor.convert.torch_legacy import (
    CHECKPOINT_FILE, TRACKER_FILE, RankStates, load_rank_file, rank_dir_name, write_model_file,
)

HF_SUBDIR = "hf"                 # config.json, tokenizer files, conversion.json inside a Megatron checkpoint
CONVERSION_FILE = "conversion.json"


class WholeTensors:
    """A safetensors checkpoint (any saved layout) as the state of one TP=PP=EP=1 rank, by module name."""

    def __init__(self, path):
        from adaptor.checkpoint.consolidated import GlobalTensors, module_name

        try:
            self.source = GlobalTensors(path)
        except CheckpointError as exc:
            raise ConversionError(str(exc)) from None
        self.path = self.source.index.dir
        self._stored = {module_name(n): n for n in self.source.tensors}

    def state(self, key) -> dict:
        return {name: self.get(key, name) for name in self._stored}

    def get(self, key, name: str, meta: bool = False) -> torch.Tensor:
        if name not in self._stored:
            raise ConversionError(f"{self.path}: tensor {name} missing")
        try:
            return self.source.meta(self._stored[name]) if meta else self.source.get(self._stored[name])
        except CheckpointError as exc:
            raise ConversionError(str(exc)) from None

    def get_meta(self, key, name: str) -> torch.Tensor:
        return self.get(key, name, meta=True)

    def release(self, key, name: str) -> None:
        pass  # each tensor is assembled into fresh memory


class MegatronCheckpoint:
    """A Megatron checkpoint directory (``latest_checkpointed_iteration.txt`` + iteration directory), read
    tensor by tensor: legacy ``--ckpt-format torch`` rank files at their layout (:class:`RankStates`), or a
    safetensors checkpoint (any saved layout) as whole tensors at TP=PP=EP=1 (:class:`WholeTensors`)."""

    def __init__(self, path, layout: Layout | None = None, hf_config_dir=None, model_type: str | None = None):
        self.path = Path(path)
        tracker = self.path / TRACKER_FILE
        if not tracker.is_file():
            raise ConversionError(f"{tracker}: missing (not a Megatron checkpoint directory)")
        text = tracker.read_text().strip()
        if text != "release" and not text.isdigit():
            raise ConversionError(f"{tracker}: does not name an iteration ({text!r})")
        self.iteration_dir = self.path / ("release" if text == "release" else f"iter_{int(text):07d}")
        if not self.iteration_dir.is_dir():
            raise ConversionError(f"{self.iteration_dir}: missing (named by {tracker.name})")
        meta_file = self.path / HF_SUBDIR / CONVERSION_FILE
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        config_dir = Path(hf_config_dir) if hf_config_dir else self.path / HF_SUBDIR
        config_file = config_dir / "config.json"
        if not config_file.is_file():
            raise ConversionError(f"{config_file}: missing (pass --hf-config-dir with the model's config.json)")
        self.hf_dir = config_dir
        self.hf_config = json.loads(config_file.read_text())
        self.model_type = model_type or meta.get("model_type")
        if self.model_type is None:
            raise ConversionError("the checkpoint does not record its model type: pass --model-type-hf")
        if is_safetensors_checkpoint(self.iteration_dir):
            self.save_format = "safetensors"
            self.layout = Layout()  # whole tensors, whatever layout it was saved at
            self.tensors = WholeTensors(self.iteration_dir)
        else:
            self.save_format = "torch"
            if layout is None and meta:
                layout = Layout(meta["tp"], meta["pp"], meta["ep"], meta.get("etp"), meta.get("vpp") or 1)
            self.layout = layout or self._layout_from_args()
            self.tensors = RankStates(self.iteration_dir, self.layout)
        if self.save_format == "safetensors" or not meta.get("padded_vocab_size"):
            self.padded_vocab_size = self.tensors.get_meta((0, 0, 0), EMBEDDING).shape[0] * self.layout.tp
        else:
            self.padded_vocab_size = meta["padded_vocab_size"]

    def _layout_from_args(self) -> Layout:
        first = next(iter(sorted(self.iteration_dir.glob(f"mp_rank_*/{CHECKPOINT_FILE}"))), None)
        if first is None:
            raise ConversionError(f"{self.iteration_dir}: no mp_rank_*/{CHECKPOINT_FILE}")
        args = load_rank_file(first).get("args")
        if args is None:
            raise ConversionError(f"{first}: no saved args to read the parallel layout from")
        return Layout.of(args)

    def state(self, key) -> dict:
        """Every tensor of rank ``key`` = (tp, pp, ep) by its state-dict name."""
        return self.tensors.state(key)


def _check_hf_tensors(hf: HfCheckpoint, mapping: ModelMapping, padded: int) -> None:
    """Every tensor the mapping needs exists, every checkpoint tensor is used, and HF copies agree."""
    used = set()
    for param in mapping.params(padded):
        for name in param.hf:
            if name not in hf:
                raise ConversionError(f"{hf.path}: tensor {name} missing (config.json expects it)")
            used.add(name)
        if param.same_as and param.same_as in hf:
            same = torch.equal(hf.get(param.hf[0]), hf.get(param.same_as))
            hf.release(param.hf[0])
            hf.release(param.same_as)
            if not same:
                raise ConversionError(f"{hf.path}: tensor {param.hf[0]} differs from {param.same_as}; "
                                      f"Megatron's MTP layer shares the main model's")
    unused = [n for n in hf.names() if n not in used]
    if unused:
        raise ConversionError(f"{hf.path}: tensor {unused[0]} is not part of the model config.json describes "
                              f"({len(unused)} unused tensors)")


SAVE_FORMATS = ("safetensors", "torch")


def sharded_key(name: str, stacked: bool, fused_norms: bool) -> tuple[str, tuple[int, ...]]:
    """The sharded-checkpoint key and prepended-axis index Megatron saves the TP=PP=EP=1 tensor ``name`` under.

    As Megatron's ``sharded_state_dict`` names them for the layer specs and flags
    :func:`adaptor.convert.megatron_args_from_hf_config` gives: decoder layers stacked on a leading
    axis when all layers are alike (``stacked``; a ``--moe-layer-freq`` list makes them one key
    each), experts stacked on the next axis, the local spec's norms under Transformer Engine's
    fused names in layers with ``linear_qkv`` (``fused_norms``), an MTP layer's
    ``mtp_model_layer`` saved as ``transformer_layer``. :func:`adaptor.checkpoint.global_names.global_name`
    is the inverse.
    """
    index: list[int] = []
    layer = re.match(r"decoder\.layers\.(\d+)\.(.*)$", name)
    if layer:
        rest = layer.group(2)
        if fused_norms:
            rest = re.sub(r"^input_layernorm\.", "self_attention.linear_qkv.layer_norm_", rest)
            rest = re.sub(r"^pre_mlp_layernorm\.", "mlp.linear_fc1.layer_norm_", rest)
        if stacked:
            index.append(int(layer.group(1)))
            name = "decoder.layers." + rest
        else:
            name = f"decoder.layers.{layer.group(1)}.{rest}"
    name = re.sub(r"^mtp\.layers\.(\d+)\.mtp_model_layer\.", r"mtp.layers.\1.transformer_layer.", name)
    expert = re.search(r"\.experts\.local_experts\.(\d+)\.", name)
    if expert:
        index.append(int(expert.group(1)))
        name = name[:expert.start()] + ".experts.experts." + name[expert.end():]
    return name, tuple(index)


def _write_safetensors_release(release: Path, hf: HfCheckpoint, mapping: ModelMapping, padded: int) -> None:
    """One rank file of whole tensors (``release``): Megatron loads it at any layout, resharding on load."""
    from adaptor.checkpoint.consolidated import write_whole_release

    specs = list(megatron_rank_tensors(hf, mapping, Layout(), padded_vocab_size=padded, meta=True))
    dense_qkv = any(".self_attention.linear_qkv.weight" in name for name, _ in specs)
    stacked = mapping.num_experts == 0  # megatron_args_from_hf_config gives MoE models a --moe-layer-freq list
    where = {name: sharded_key(name, stacked, dense_qkv) for name, _ in specs}
    write_whole_release(release, specs, where, megatron_rank_tensors(hf, mapping, Layout(), padded_vocab_size=padded),
                        str(hf.path))


def _write_torch_rank(release: Path, hf: HfCheckpoint, mapping: ModelMapping, layout: Layout, tp_rank: int,
                      pp_rank: int, ep_rank: int, padded: int) -> None:
    """One legacy rank file: its "model" state, or "model0", "model1", ... with virtual pipeline stages
    (as Megatron saves its model chunks)."""
    import itertools

    specs, streams = {}, []
    for vp_stage in range(layout.vpp):
        kwargs = dict(vp_stage=vp_stage, padded_vocab_size=padded)
        chunk = list(megatron_rank_tensors(hf, mapping, layout, tp_rank, pp_rank, ep_rank, meta=True, **kwargs))
        names = [name for name, _ in chunk]
        stage = layout.stage(pp_rank, vp_stage)
        chunk += [(name, None) for name in extra_state_names(names, stage, layout, mapping.tied)]
        specs["model" if layout.vpp == 1 else f"model{vp_stage}"] = chunk
        streams.append(megatron_rank_tensors(hf, mapping, layout, tp_rank, pp_rank, ep_rank, **kwargs))
    rank_dir = release / rank_dir_name(tp_rank, pp_rank, ep_rank, layout.pp, layout.ep)
    rank_dir.mkdir(parents=True)
    write_model_file(rank_dir / CHECKPOINT_FILE, specs, itertools.chain(*streams))


def convert_hf_to_megatron(load_dir, save_dir, model_type: str, layout: Layout, *,
                           make_vocab_size_divisible_by: int = 128, padded_vocab_size: int | None = None,
                           save_format: str = "safetensors") -> Path:
    """Write a release checkpoint `pretrain_gpt.py --load save_dir` reads.

    ``save_format="safetensors"`` (default): one file of whole tensors, no pickle; any TP/PP/EP layout,
    virtual pipeline stages included, loads it (resharded on load; `layout` sets the vocabulary padding and
    is checked). ``"torch"``: Megatron's legacy ``--ckpt-format torch`` rank files, for that exact `layout`
    (with virtual stages each file holds ``model0``, ``model1``, ... as Megatron saves its model chunks).
    """
    if save_format not in SAVE_FORMATS:
        raise ConversionError(f"save format {save_format!r}: choose {' or '.join(SAVE_FORMATS)}")
    hf = HfCheckpoint(load_dir)
    mapping = model_mapping(model_type, hf.config).for_checkpoint(hf)
    mapping.check_layout(layout)
    padded = padded_vocab_size or default_padded_vocab(mapping.vocab_size, layout.tp, make_vocab_size_divisible_by)
    if padded < mapping.vocab_size or padded % layout.tp:
        raise ConversionError(f"padded vocabulary {padded} must be >= vocab_size {mapping.vocab_size} "
                              f"and divisible by the tensor parallel size {layout.tp}")
    _check_hf_tensors(hf, mapping, padded)
    with staged_directory(save_dir, error=ConversionError) as temp:
        release = temp / "release"
        if save_format == "safetensors":
            _write_safetensors_release(release, hf, mapping, padded)
        else:
            for tp_rank, pp_rank, ep_rank in layout.rank_keys():
                _write_torch_rank(release, hf, mapping, layout, tp_rank, pp_rank, ep_rank, padded)
        (temp / TRACKER_FILE).write_text("release")
        copy_side_files(hf.path, temp / HF_SUBDIR)
        (temp / HF_SUBDIR / CONVERSION_FILE).write_text(json.dumps({
            "model_type": model_type, "format": save_format, "tp": layout.tp, "pp": layout.pp, "ep": layout.ep,
            "etp": layout.etp, "vpp": layout.vpp, "vocab_size": mapping.vocab_size, "padded_vocab_size": padded},
            indent=2) + "\n")
    return Path(save_dir)


def convert_megatron_to_hf(load_dir, save_dir, model_type: str | None = None, *, hf_config_dir=None,
                           layout: Layout | None = None, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write config.json (+ tokenizer files) and safetensors shards from a Megatron checkpoint (safetensors or
    legacy ``--ckpt-format torch``; see :class:`MegatronCheckpoint`)."""
    mg = MegatronCheckpoint(load_dir, layout, hf_config_dir, model_type)
    return write_hf_dir(save_dir, mg.tensors, mg.model_type, mg.hf_config, mg.layout, mg.padded_vocab_size,
                        side_files=mg.hf_dir, max_shard_bytes=max_shard_bytes)


def merge_to_hf(load, save_dir, model_type: str, max_shard_bytes: int = 5 * 2**30) -> Path:
    """``tools/safetensors_ckpt.py merge --model-type-hf``: a training checkpoint in safetensors (a --save
    directory or an iteration directory, any layout) as a Hugging Face directory.

    Unlike :func:`convert_megatron_to_hf` it needs no config.json: that is written from the arguments
    the run saved. ``megatron_checkpoint.json`` records where the tensors came from, as merge does.
    """
    from adaptor.checkpoint.consolidated import merged_description
    from adaptor.checkpoint.consolidated_dirs import SIDE_FILE
    from adaptor.convert.online import hf_config_from_args

    whole = WholeTensors(load)
    try:
        args = whole.source.common_state().get("args")
        if args is None:
            raise ConversionError(f"{whole.path}: no saved arguments to describe the model with")
        try:
            config = hf_config_from_args(argparse.Namespace(**{**vars(args), "model_type_hf": model_type}))
        except ValueError as exc:  # a setting no config of this family describes
            raise ConversionError(f"{whole.path}: {exc}") from None
        return write_hf_dir(save_dir, whole, model_type, config, Layout(), args.padded_vocab_size,
                            extra_files={SIDE_FILE: merged_description(whole.source, model_type)},
                            max_shard_bytes=max_shard_bytes)
    finally:
        whole.source.index.close()
