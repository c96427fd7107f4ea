"""A sharded checkpoint seen as whole tensors, and written out as one Hub-style directory.

:class:`GlobalTensors` assembles each whole tensor of a checkpoint, named as Megatron's own
``state_dict()`` names it at TP=PP=EP=1 (``decoder.layers.3.mlp.experts.local_experts.1.linear_fc1.weight``;
:mod:`adaptor.checkpoint.global_names`), from whichever rank files hold its pieces. :func:`merge`
writes the model part as ``model-0000x-of-0000N.safetensors`` + ``model.safetensors.index.json``
with those names, or with Hugging Face names for the architectures :mod:`adaptor.convert` maps,
plus ``megatron_checkpoint.json`` (iteration, arguments, name -> key/index) so the directory can be
split into a parallel layout again.
"""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import torch

from adaptor.checkpoint import files
from adaptor.checkpoint.errors import CheckpointError
from adaptor.checkpoint.global_names import GlobalTensor, global_tensors
from adaptor.checkpoint.object_codec import dtype_from_name
from adaptor.checkpoint.reader import CheckpointIndex
from adaptor.checkpoint.unified_dirs import SIDE_FILE, partial_dir, publish, read_side_file, resolve


class GlobalTensors:
    """Whole tensors of one checkpoint, by name; each assembled on request from the rank files."""

    def __init__(self, checkpoint_dir, model_only: bool = True):
        self.index = CheckpointIndex(resolve(checkpoint_dir))
        self.tensors: dict[str, GlobalTensor] = global_tensors(self.index.shards, model_only)

    def request(self, name: str):
        """A ShardedTensor asking for the whole tensor ``name`` (what a TP=PP=EP=1 rank would hold)."""
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        t = self.tensors[name]
        global_shape = (*self.index.shards[t.key][0].global_shape,)
        return ShardedTensor(t.key, None, dtype_from_name(t.dtype), t.shape, global_shape,
                             (*t.index, *(0,) * len(t.shape)), None, prepend_axis_num=len(t.index))

    def get(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise CheckpointError(f"{self.index.dir}: no tensor {name}")
        return self.index.load_tensor(self.request(name))

    def meta(self, name: str) -> torch.Tensor:
        t = self.tensors[name]
        return torch.empty(t.shape, dtype=dtype_from_name(t.dtype), device="meta")

    def common_state(self) -> dict:
        return self.index.common_state()


# -------------------------------------------------------------------------------- merge
# The local spec stores layer norms under TE's fused names in checkpoints (Megatron's
# sharded_state_dict_keys_map); adaptor.convert's mappings use the module names.
_FUSED_NORMS = (("self_attention.linear_qkv.layer_norm_", "input_layernorm."),
                ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."))


def module_name(name: str) -> str:
    """A checkpoint tensor's name with the module names the local spec uses (``input_layernorm``)."""
    for fused, module in _FUSED_NORMS:
        name = name.replace(fused, module)
    return name


def merge(load, save_dir, model_type_hf: str | None = None, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write the model of a sharded checkpoint as whole tensors (Megatron or Hugging Face names)."""
    from adaptor.convert.hf_directory import write_safetensors_checkpoint

    source = GlobalTensors(load)
    common = source.common_state()
    args = common.get("args")
    save_dir = Path(save_dir)
    temp = partial_dir(save_dir)
    try:
        if model_type_hf is None:
            names = list(source.tensors)
            specs = [(n, source.meta(n)) for n in names]
            write_safetensors_checkpoint(temp, specs, ((n, source.get(n)) for n in names), max_shard_bytes)
        else:
            _write_hf(source, args, model_type_hf, temp, max_shard_bytes)
        side = {"format": files.FORMAT_NAME, "source": str(source.index.dir), "iteration": common.get("iteration"),
                "names": "hf" if model_type_hf else "megatron", "model_type_hf": model_type_hf,
                "command_line": source.index.doc.get("command_line"),
                "parallel": source.index.doc.get("parallel"),
                "tensors": {t.name: {"key": t.key, "index": list(t.index)} for t in source.tensors.values()}}
        (temp / SIDE_FILE).write_text(json.dumps(side, indent=1) + "\n")
        publish(temp, save_dir)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        source.index.close()
    return save_dir


def _write_hf(source: GlobalTensors, args, model_type: str, temp: Path, max_shard_bytes: int) -> None:
    import argparse

    from adaptor.convert import ConversionError, Layout, hf_tensors_from_megatron, write_safetensors_checkpoint
    from adaptor.convert.online import hf_config_from_args

    by_module_name = {module_name(n): n for n in source.tensors}

    def name_of(name):
        if name not in by_module_name:
            raise CheckpointError(f"{source.index.dir}: no tensor for {name} (is this a {model_type} model?)")
        return by_module_name[name]

    config = hf_config_from_args(argparse.Namespace(**{**vars(args), "model_type_hf": model_type}))
    export = functools.partial(hf_tensors_from_megatron, model_type=model_type, hf_config=config, layout=Layout(),
                               padded_vocab_size=args.padded_vocab_size)
    try:
        specs = list(export(lambda _, n: source.meta(name_of(n))))
        write_safetensors_checkpoint(temp, specs, export(lambda _, n: source.get(name_of(n))), max_shard_bytes)
    except ConversionError as exc:
        raise CheckpointError(str(exc)) from None
    (temp / "config.json").write_text(json.dumps(config, indent=2) + "\n")



# -------------------------------------------------------------------------------- split
def to_release(unified_dir, save_dir) -> Path:
    """A weights-only checkpoint (``release``, one rank file) from a Megatron-named merged directory.

    Megatron loads it at any layout (``--load``; resharded on load); ``tools/safetensors_ckpt.py
    split`` saves it again at a given layout.
    """
    from adaptor.checkpoint.writer import FilePayload, rank_metadata, write_payload

    unified_dir, save_dir = Path(unified_dir), Path(save_dir)
    side = read_side_file(unified_dir)
    entries = side["tensors"]
    source = _MergedTensors(unified_dir)
    counts: dict[str, list[int]] = {}
    for entry in entries.values():
        index = entry["index"]
        grown = counts.setdefault(entry["key"], [0] * len(index))
        counts[entry["key"]] = [max(c, i + 1) for c, i in zip(grown, index)]
    shards, tensors = [], []
    for name, entry in entries.items():
        if name not in source:
            raise CheckpointError(f"{unified_dir}: tensor {name} listed in {SIDE_FILE} is missing")
        tensor = source.get(name)
        index = list(entry["index"])
        shards.append({"name": name, "key": entry["key"], "dtype": str(tensor.dtype).removeprefix("torch."),
                       "global_shape": counts[entry["key"]] + list(tensor.shape),
                       "global_offset": index + [0] * tensor.dim(), "local_shape": list(tensor.shape),
                       "prepend_axis_num": len(index), "flattened_range": None})
        tensors.append((name, tensor))
    temp = partial_dir(save_dir)
    try:
        release = temp / "release"
        staging = files.prepare_staging(release)
        rank = FilePayload(files.rank_file(0), tensors, rank_metadata(0, shards, {}))
        common = FilePayload("", [], {}, json_name=files.COMMON_JSON, json_doc={
            "format": files.FORMAT_NAME, "version": files.BACKEND_VERSION, "iteration": 0, "world_size": 1,
            "files": [files.rank_file(0)], "source": str(unified_dir), "command_line": side.get("command_line"),
            "weights_only": True,
            "state": {"checkpoint_version": 3.0, "iteration": 0}})
        write_payload(str(staging), [rank, common])
        files.commit(release)
        (temp / files.TRACKER).write_text("release")
        publish(temp, save_dir)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return save_dir


class _MergedTensors:
    """The tensors of a merged directory (model.safetensors or shards + model.safetensors.index.json)."""

    def __init__(self, path: Path):
        from adaptor.convert.hf_directory import INDEX_FILE, SINGLE_FILE
        from adaptor.safetensors_file import SafetensorsError, SafetensorsFile

        index = path / INDEX_FILE
        try:
            names = (json.loads(index.read_text())["weight_map"] if index.is_file()
                     else {n: SINGLE_FILE for n in SafetensorsFile(path / SINGLE_FILE).tensors})
            self._files = {f: SafetensorsFile(files.member(path, f)) for f in set(names.values())}
        except (OSError, ValueError, KeyError, SafetensorsError) as exc:
            raise CheckpointError(f"{path}: not a merged safetensors directory ({exc})") from None
        self._where = {n: self._files[f] for n, f in names.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._where and name in self._where[name].tensors

    def get(self, name: str) -> torch.Tensor:
        return self._where[name].get(name)
