"""HF <-> Megatron conversion, tensor by tensor.

The same functions run twice: on meta tensors (shapes and dtypes only, to write file
headers first) and on real ones (memory-mapped inputs, one output tensor alive at a time).
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Iterator

import torch

from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import Layout, padded_vocab_size as default_padded_vocab
from adaptor.convert.mapping import EMBEDDING, ModelMapping, Param, extra_state_names
from adaptor.convert.models import model_mapping
from adaptor.convert.hf_directory import HfCheckpoint, write_safetensors_checkpoint
from adaptor.checkpoint.files import is_safetensors_checkpoint
from adaptor.convert.torch_legacy import (
    CHECKPOINT_FILE, TRACKER_FILE, drop_pages, mapped_ranges, rank_dir_name, read_model_state, write_model_file,
)

HF_SUBDIR = "hf"                 # config.json, tokenizer files, conversion.json inside a Megatron checkpoint
CONVERSION_FILE = "conversion.json"
HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")


def _mapping(model_type, hf_config) -> ModelMapping:
    return model_type if isinstance(model_type, ModelMapping) else model_mapping(model_type, hf_config)


def _parallel(param: Param, layout: Layout, tp_rank: int) -> tuple[int, int]:
    """(rank, size) of the split `param` follows on tensor rank `tp_rank`."""
    if param.parallel == "tp":
        return tp_rank, layout.tp
    if param.parallel == "etp" and layout.expert_tp > 1:
        return tp_rank, layout.expert_tp
    return 0, 1


def _rank_params(mapping: ModelMapping, layout: Layout, pp_rank: int, ep_rank: int, padded: int):
    for param in mapping.params(padded):
        if not param.to_megatron or pp_rank not in mapping.stage_of(param, layout):
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
                          ep_rank: int = 0, *, padded_vocab_size: int | None = None,
                          make_vocab_size_divisible_by: int = 128, meta: bool = False
                          ) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of rank (tp_rank, pp_rank, ep_rank) of Megatron's local-spec GPTModel, as HF views.

    `meta=True` yields meta tensors (shapes and dtypes from the safetensors headers only).
    """
    mapping = _mapping(model_type, hf.config)
    padded = padded_vocab_size or default_padded_vocab(mapping.vocab_size, layout.tp, make_vocab_size_divisible_by)
    get = hf.get_meta if meta else hf.get
    for name, param in _rank_params(mapping, layout, pp_rank, ep_rank, padded):
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
    """HF tensors one at a time; `get((tp_rank, pp_rank, ep_rank), megatron_name)` reads a rank's tensor,
    `release(key, name)` (optional) is called once the tensors made from it were consumed."""
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


# -- directories ---------------------------------------------------------------------------

class MegatronCheckpoint:
    """A Megatron checkpoint directory (``latest_checkpointed_iteration.txt`` + iteration directory), read
    tensor by tensor: legacy ``--ckpt-format torch`` rank files (memory-mapped, unpickled with
    ``weights_only=True``) at their layout, or a safetensors checkpoint (any saved layout) as whole
    tensors at TP=PP=EP=1."""

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
        self._states: dict = {}
        self._mapped: dict = {}
        self.global_tensors = None
        if is_safetensors_checkpoint(self.iteration_dir):
            self.save_format = "safetensors"
            self._open_safetensors()
            self.layout = Layout()  # whole tensors, whatever layout it was saved at
        else:
            self.save_format = "torch"
            if layout is None and meta:
                layout = Layout(meta["tp"], meta["pp"], meta["ep"], meta.get("etp"))
            self.layout = layout or self._layout_from_args()
        if self.save_format == "safetensors" or not meta.get("padded_vocab_size"):
            self.padded_vocab_size = self._padded_vocab()
        else:
            self.padded_vocab_size = meta["padded_vocab_size"]

    def _open_safetensors(self) -> None:
        from adaptor.checkpoint.errors import CheckpointError
        from adaptor.checkpoint.unified import GlobalTensors, module_name

        try:
            self.global_tensors = GlobalTensors(self.iteration_dir)
        except CheckpointError as exc:
            raise ConversionError(str(exc)) from None
        self._by_module_name = {module_name(n): n for n in self.global_tensors.tensors}

    def _layout_from_args(self) -> Layout:
        first = next(iter(sorted(self.iteration_dir.glob(f"mp_rank_*/{CHECKPOINT_FILE}"))), None)
        if first is None:
            raise ConversionError(f"{self.iteration_dir}: no mp_rank_*/{CHECKPOINT_FILE}")
        from adaptor.safe_load import RefusedPickle, torch_load

        try:
            args = torch_load(first, map_location="cpu", mmap=True).get("args")
        except RefusedPickle as exc:
            raise ConversionError(str(exc)) from None
        except Exception as exc:  # torch raises RuntimeError/EOFError for damaged files
            raise ConversionError(f"{first}: cannot read the checkpoint ({str(exc).splitlines()[0]})") from None
        if args is None:
            raise ConversionError(f"{first}: no saved args to read the parallel layout from")
        tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
        ep = getattr(args, "expert_model_parallel_size", 1)
        etp = getattr(args, "expert_tensor_parallel_size", None)
        if getattr(args, "virtual_pipeline_model_parallel_size", None):
            raise ConversionError(f"{first}: virtual pipeline checkpoints are not supported")
        return Layout(tp, pp, ep, etp if etp != tp else None)

    def _padded_vocab(self) -> int:
        return self.get_meta((0, 0, 0), EMBEDDING).shape[0] * self.layout.tp

    def file(self, key: tuple[int, int, int]) -> Path:
        tp_rank, pp_rank, ep_rank = key
        return self.iteration_dir / rank_dir_name(tp_rank, pp_rank, ep_rank, self.layout.pp, self.layout.ep) \
            / CHECKPOINT_FILE

    def state(self, key) -> dict:
        """Every tensor of rank ``key`` = (tp, pp, ep) by its state-dict name (``_extra_state`` entries None)."""
        if self.global_tensors is not None:
            return {name: self.get(key, name) for name in self._by_module_name}
        if key not in self._states:
            self._states[key] = read_model_state(self.file(key))
            self._mapped[key] = mapped_ranges(self.file(key))
        return self._states[key]

    def get(self, key, name: str) -> torch.Tensor:
        if self.global_tensors is not None:
            return self._global(name, meta=False)
        state = self.state(key)
        if name not in state:
            raise ConversionError(f"{self.file(key)}: tensor {name} missing")
        return state[name]

    def release(self, key, name: str) -> None:
        """Give back the memory-mapped pages of a tensor already used (unchanged pages, re-read on demand)."""
        state = self._states.get(key)
        if state is not None and state.get(name) is not None:
            drop_pages(state[name], self._mapped[key])

    def get_meta(self, key, name: str) -> torch.Tensor:
        if self.global_tensors is not None:
            return self._global(name, meta=True)
        return self.get(key, name).to("meta")

    def _global(self, name: str, meta: bool) -> torch.Tensor:
        from adaptor.checkpoint.errors import CheckpointError

        stored = self._by_module_name.get(name)
        if stored is None:
            raise ConversionError(f"{self.iteration_dir}: tensor {name} missing")
        try:
            return self.global_tensors.meta(stored) if meta else self.global_tensors.get(stored)
        except CheckpointError as exc:
            raise ConversionError(str(exc)) from None


def _temp_beside(save_dir: Path) -> Path:
    if save_dir.exists() and (not save_dir.is_dir() or any(save_dir.iterdir())):
        raise ConversionError(f"--save-dir {save_dir} exists and is not empty (refusing to overwrite)")
    save_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = save_dir.parent / f".{save_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    return temp


def _publish(temp: Path, save_dir: Path) -> None:
    if save_dir.exists():
        save_dir.rmdir()  # empty, checked by _temp_beside
    temp.rename(save_dir)


def _copy_side_files(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in HF_SIDE_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


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


def _write_safetensors_release(release: Path, hf: HfCheckpoint, mapping: ModelMapping, padded: int,
                               source: str) -> None:
    """One rank file of whole tensors (``release``): Megatron loads it at any layout, resharding on load."""
    from adaptor.checkpoint import files
    from adaptor.checkpoint.writer import rank_metadata
    from adaptor.safetensors_file import fsync_dir, header_bytes, tensor_bytes

    layout = Layout()
    specs = list(megatron_rank_tensors(hf, mapping, layout, padded_vocab_size=padded, meta=True))
    names = {name for name, _ in specs}
    dense_qkv = any(".self_attention.linear_qkv.weight" in n for n in names)
    stacked = mapping.num_experts == 0  # megatron_args_from_hf_config gives MoE models a --moe-layer-freq list
    keyed = [(name, meta, *sharded_key(name, stacked, dense_qkv)) for name, meta in specs]
    counts: dict[str, list[int]] = {}
    for _, _, key, index in keyed:
        grown = counts.setdefault(key, [0] * len(index))
        counts[key] = [max(c, i + 1) for c, i in zip(grown, index)]
    shards = [{"name": name, "key": key, "dtype": str(meta.dtype).removeprefix("torch."),
               "global_shape": counts[key] + list(meta.shape), "global_offset": list(index) + [0] * meta.dim(),
               "local_shape": list(meta.shape), "prepend_axis_num": len(index), "flattened_range": None}
              for name, meta, key, index in keyed]
    staging = files.prepare_staging(release)
    rank_file = staging / files.rank_file(0)
    header = header_bytes(((n, m.dtype, tuple(m.shape)) for n, m in specs), rank_metadata(0, shards, {}))
    with open(rank_file, "wb") as out:
        out.write(header)
        tensors = megatron_rank_tensors(hf, mapping, layout, padded_vocab_size=padded)
        for (name, meta), (got, tensor) in itertools.zip_longest(specs, tensors, fillvalue=(None, None)):
            if got != name or tuple(tensor.shape) != tuple(meta.shape) or tensor.dtype != meta.dtype:
                raise ConversionError(f"internal: expected tensor {name}, got {got}")
            out.write(tensor_bytes(tensor))
            del tensor
        out.flush()
        os.fsync(out.fileno())
    files.write_json(staging / files.COMMON_JSON, {
        "format": files.FORMAT_NAME, "version": files.BACKEND_VERSION, "iteration": 0, "world_size": 1,
        "files": [files.rank_file(0)], "source": source, "command_line": None, "weights_only": True,
        "state": {"checkpoint_version": 3.0, "iteration": 0}}, indent=1)
    fsync_dir(staging)
    files.commit(release)


def convert_hf_to_megatron(load_dir, save_dir, model_type: str, layout: Layout, *,
                           make_vocab_size_divisible_by: int = 128, padded_vocab_size: int | None = None,
                           save_format: str = "safetensors") -> Path:
    """Write a release checkpoint `pretrain_gpt.py --load save_dir` reads.

    ``save_format="safetensors"`` (default): one file of whole tensors, no pickle; any TP/PP/EP layout
    loads it (resharded on load; `layout` sets the vocabulary padding and is checked). ``"torch"``:
    Megatron's legacy ``--ckpt-format torch`` rank files, for that exact `layout`.
    """
    if save_format not in SAVE_FORMATS:
        raise ConversionError(f"save format {save_format!r}: choose {' or '.join(SAVE_FORMATS)}")
    hf = HfCheckpoint(load_dir)
    mapping = model_mapping(model_type, hf.config)
    mapping.check_layout(layout)
    padded = padded_vocab_size or default_padded_vocab(mapping.vocab_size, layout.tp, make_vocab_size_divisible_by)
    if padded < mapping.vocab_size or padded % layout.tp:
        raise ConversionError(f"padded vocabulary {padded} must be >= vocab_size {mapping.vocab_size} "
                              f"and divisible by the tensor parallel size {layout.tp}")
    _check_hf_tensors(hf, mapping, padded)
    save_dir = Path(save_dir)
    temp = _temp_beside(save_dir)
    try:
        release = temp / "release"
        if save_format == "safetensors":
            _write_safetensors_release(release, hf, mapping, padded, str(hf.path))
        else:
            for tp_rank, pp_rank, ep_rank in layout.rank_keys():
                kwargs = dict(padded_vocab_size=padded)
                specs = list(megatron_rank_tensors(hf, mapping, layout, tp_rank, pp_rank, ep_rank, meta=True,
                                                   **kwargs))
                names = [name for name, _ in specs]
                specs += [(name, None) for name in extra_state_names(names, pp_rank, layout, mapping.tied)]
                rank_dir = release / rank_dir_name(tp_rank, pp_rank, ep_rank, layout.pp, layout.ep)
                rank_dir.mkdir(parents=True)
                tensors = megatron_rank_tensors(hf, mapping, layout, tp_rank, pp_rank, ep_rank, **kwargs)
                write_model_file(rank_dir / CHECKPOINT_FILE, specs, tensors)
        (temp / TRACKER_FILE).write_text("release")
        _copy_side_files(hf.path, temp / HF_SUBDIR)
        (temp / HF_SUBDIR / CONVERSION_FILE).write_text(json.dumps({
            "model_type": model_type, "format": save_format, "tp": layout.tp, "pp": layout.pp, "ep": layout.ep,
            "etp": layout.etp, "vocab_size": mapping.vocab_size, "padded_vocab_size": padded}, indent=2) + "\n")
        _publish(temp, save_dir)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return save_dir


def convert_megatron_to_hf(load_dir, save_dir, model_type: str | None = None, *, hf_config_dir=None,
                           layout: Layout | None = None, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write config.json (+ tokenizer files) and safetensors shards from a Megatron checkpoint (safetensors or
    legacy ``--ckpt-format torch``; see :class:`MegatronCheckpoint`)."""
    mg = MegatronCheckpoint(load_dir, layout, hf_config_dir, model_type)
    mapping = model_mapping(mg.model_type, mg.hf_config)
    mapping.check_layout(mg.layout)
    save_dir = Path(save_dir)
    temp = _temp_beside(save_dir)
    try:
        def export(get, release=None):
            return hf_tensors_from_megatron(get, mapping, mg.hf_config, mg.layout,
                                            padded_vocab_size=mg.padded_vocab_size, release=release)
        try:
            specs = list(export(mg.get_meta))
        except RuntimeError as exc:
            raise ConversionError(f"{mg.path}: the checkpoint does not match config.json "
                                  f"({str(exc).splitlines()[0]})") from None
        write_safetensors_checkpoint(temp, specs, export(mg.get, mg.release), max_shard_bytes)
        _copy_side_files(mg.hf_dir, temp)
        _publish(temp, save_dir)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return save_dir
