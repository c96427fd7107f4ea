"""A LoRA run's checkpoints: the base model in one directory, the adapters (and what trains them) in another.

``megatron.training.checkpointing.generate_state_dict`` builds both saved and requested state from each
chunk's ``sharded_state_dict()`` / ``state_dict_for_save_checkpoint()``; :func:`views` gives it chunks
holding one part: :data:`BASE` (all but adapters, what ``--load`` gives) or :data:`ADAPTERS` (``lora_A`` /
``lora_B``, what a LoRA run saves and ``--lora-load`` restores; the optimizer state then covers
exactly them). :func:`after_load` drops the other part's keys from torch's missing list so Megatron's
strict load still checks the rest; :func:`check_load` compares a sharded checkpoint's adapters with the
model's first, so a mismatch is one line naming the tensor.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from adaptor.lora import is_lora_name

BASE = "base"
ADAPTERS = "adapters"

_mode: Optional[str] = None


class AdapterCheckpointError(Exception):
    """A checkpoint that does not fit the run's adapters; the message is one line."""


@contextlib.contextmanager
def loading(mode: str) -> Iterator[None]:
    """Checkpoint loads inside the block read the ``mode`` part of the model state only."""
    global _mode
    previous, _mode = _mode, mode
    try:
        yield
    finally:
        _mode = previous


def current() -> Optional[str]:
    """The part a load in progress reads (None outside the LoRA feature's loads)."""
    return _mode


def keep(key: str, mode: str) -> bool:
    return is_lora_name(key) == (mode == ADAPTERS)


class _PartView:
    """A model chunk as ``generate_state_dict`` sees it: its state restricted to one part."""

    def __init__(self, chunk, mode: str):
        self._chunk, self._mode = chunk, mode

    def sharded_state_dict(self, *args, **kwargs):
        state = self._chunk.sharded_state_dict(*args, **kwargs)
        return {k: v for k, v in state.items() if keep(k, self._mode)}

    def state_dict_for_save_checkpoint(self, *args, **kwargs):
        state = self._chunk.state_dict_for_save_checkpoint(*args, **kwargs)
        return type(state)((k, v) for k, v in state.items() if keep(k, self._mode))

    def __getattr__(self, name):
        return getattr(self._chunk, name)


def views(chunks, mode: str) -> list:
    return [_PartView(chunk, mode) for chunk in chunks]


def after_load(module, incompatible) -> None:
    """``load_state_dict`` post-hook: during a one-part load the other part is expected to be absent.

    An adapter checkpoint that lacks one of the run's adapters, or holds one the run does not build,
    raises AdapterCheckpointError (``--ckpt-format torch``; sharded formats are checked by
    :func:`check_load` before they are read)."""
    mode = _mode
    if mode is None:
        return
    missing = incompatible.missing_keys
    if mode == ADAPTERS:
        absent = [k for k in missing if is_lora_name(k)]
        extra = [k for k in incompatible.unexpected_keys if is_lora_name(k)]
        if absent:
            raise AdapterCheckpointError(
                f"the checkpoint has no {absent[0]}" + (f" (and {len(absent) - 1} more adapters)" if len(absent) > 1
                                                        else "")
                + ": it was saved with other --lora-target-modules, or holds no adapters")
        if extra:
            raise AdapterCheckpointError(f"the checkpoint has adapters this run does not build ({extra[0]}): "
                                         f"it was saved with other --lora-target-modules")
    missing[:] = [k for k in missing if keep(k, mode)]


def _targets(keys) -> list[str]:
    """Adapted module names (``linear_qkv``) of adapter keys."""
    names = set()
    for key in keys:
        parts = key.split(".")
        for i, part in enumerate(parts):
            if part in ("lora_A", "lora_B") and i:
                names.add(parts[i - 1])
    return sorted(names)


def _model_tensors(sharded_state_dict) -> list:
    """The ShardedTensors of the model part of a load request (SwiGLU factories built into their halves)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    tensors = []
    for name, part in sharded_state_dict.items():
        if not (name == "model" or (name.startswith("model") and name[5:].isdigit())):
            continue
        for item in nested_values(part):
            if isinstance(item, ShardedTensorFactory):
                tensors += [t for t in nested_values(item.build()) if isinstance(t, ShardedTensor)]
            elif isinstance(item, ShardedTensor):
                tensors.append(item)
    return tensors


def check_load(sharded_state_dict, checkpoint_shapes: dict, mode: str) -> None:
    """Raise AdapterCheckpointError (one line) when a sharded checkpoint cannot give the ``mode`` part.

    ``checkpoint_shapes``: key -> global shape of every tensor the checkpoint holds.
    """
    wanted = [t for t in _model_tensors(sharded_state_dict) if keep(t.key, mode)]
    stored_adapters = {k for k in checkpoint_shapes if is_lora_name(k) and not k.startswith("optimizer")}
    if mode == BASE:
        absent = [t.key for t in wanted if t.key not in checkpoint_shapes]
        if absent and stored_adapters:
            raise AdapterCheckpointError(
                "holds LoRA adapters, not a base model (no " + absent[0] + "): give the base model's checkpoint "
                "to --load and this one to --lora-load")
        return
    wanted_keys = {t.key for t in wanted}
    run = ", ".join(_targets(wanted_keys)) or "nothing"
    saved = ", ".join(_targets(stored_adapters)) or "nothing"
    absent = sorted(wanted_keys - set(checkpoint_shapes))
    if absent:
        raise AdapterCheckpointError(
            f"the checkpoint has no {absent[0]}: its adapters are on {saved}, this run's on {run} "
            f"(--lora-target-modules)" if stored_adapters else
            f"the checkpoint has no adapters (no {absent[0]}): give --lora-load a directory a LoRA run saved")
    extra = sorted(stored_adapters - wanted_keys)
    if extra:
        raise AdapterCheckpointError(
            f"the checkpoint has {extra[0]}, which this run does not build: its adapters are on {saved}, "
            f"this run's on {run} (--lora-target-modules)")
    for tensor in wanted:
        stored, want = tuple(checkpoint_shapes[tensor.key]), tuple(tensor.global_shape)
        if stored == want:
            continue
        rank_dim = -2 if ".lora_A." in tensor.key else -1  # A is [r, in], B is [out, r] (after any stacking axes)
        line = f"tensor {tensor.key} has shape {list(stored)} in the checkpoint but {list(want)} in this model: "
        if len(stored) == len(want) and stored[rank_dim] != want[rank_dim]:
            line += f"the adapters have rank {stored[rank_dim]}; pass --lora-r {stored[rank_dim]}"
        else:
            line += "the adapters were trained on a base model of another shape than the one these flags build"
        raise AdapterCheckpointError(line)
