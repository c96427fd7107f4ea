"""``--ckpt-format safetensors``: Megatron's sharded checkpoints stored as safetensors, without pickle.

Megatron's ``torch_dist`` path already describes the state as global tensors sliced per rank; we keep
that path and replace only the storage (torch.distributed.checkpoint and pickle):

* ``training.checkpointing.save_checkpoint`` / ``load_checkpoint``: ``args.ckpt_format`` reads
  ``torch_dist`` while they run, so Megatron's sharded branches are taken as they are; one async
  save in flight; ``--keep-checkpoint-max`` prunes after a complete save. A ``--ckpt-format torch``
  run loads a safetensors ``--load`` the same way.
* ``dist_checkpointing.serialization.save``: writes through :mod:`adaptor.checkpoint.serialization`.
* ``dist_checkpointing.serialization.{load, load_common_state_dict, load_tensors_metadata,
  load_sharded_metadata}``: a ``metadata.json`` naming the ``safetensors`` backend is read by our
  reader whatever ``--ckpt-format`` says, resharded to the run's layout.
* ``training.checkpointing._build_sharded_state_dict_metadata``: the distributed optimizer's state
  is saved as ``fully_sharded_model_space`` (no save-time communication, reshardable anywhere)
  unless ``--dist-ckpt-optim-fully-reshardable``.
* ``dist_checkpointing.mapping.ShardedTensor.validate_metadata_integrity``: megatron-core 0.19.2
  refuses the flattened shards its distributed optimizer still builds; they are accepted during
  checkpoint operations and :mod:`adaptor.checkpoint.validation` checks the ranges tile each chunk.
* ``transformer.mlp.apply_swiglu_sharded_factory`` halves SwiGLU's ``[W; V]`` rows, wrong for a
  flattened range; :mod:`adaptor.checkpoint.flat_shards` cuts at the W/V boundary.
* ``optimizer.distrib_optimizer.DistributedOptimizer._set_main_param_and_optimizer_states`` asks
  for Adam's ``step``, which that layout does not store; such keys are skipped.

Remove when: for the last three bullets only (the format itself is a feature): megatron-core either
accepts flattened shards in ``ShardedTensor.validate_metadata_integrity`` or stops building them for
``fully_sharded_model_space`` (upstream dropped flattened-range support in
https://github.com/NVIDIA/Megatron-LM/pull/2126 but that layout still sets ``flattened_range``;
reported in https://github.com/NVIDIA/Megatron-LM/issues/2956, open),
``apply_swiglu_sharded_factory`` cuts a flattened range at the W/V boundary, and
``_set_main_param_and_optimizer_states`` skips state keys the checkpoint does not hold. None is
fixed in megatron-core 0.19.2 nor on Megatron-LM main (d98e8a64, 2026-08-22).
"""
from __future__ import annotations

import contextlib
import functools

from adaptor.features import ArgumentError, Feature
from adaptor.wrapping import argument

OWNER = __name__
FORMAT = "safetensors"

_saving = False  # inside save_checkpoint of a --ckpt-format safetensors run
_checkpoint_ops = 0  # depth of save_checkpoint / load_checkpoint calls
_pending_request = None  # the AsyncRequest our save returned, for save_checkpoint's wrapper


@contextlib.contextmanager
def _checkpoint_operation(args, saving: bool, sharded_on_disk: bool = False):
    """Present the run as ``torch_dist`` to Megatron's checkpointing for the duration of one call
    (also a ``--ckpt-format torch`` load of a safetensors checkpoint: ``sharded_on_disk``)."""
    global _saving, _checkpoint_ops
    flip = args.ckpt_format == FORMAT or sharded_on_disk
    previous, previous_format = _saving, args.ckpt_format
    if flip:
        args.ckpt_format = "torch_dist"
    _saving = flip and saving
    _checkpoint_ops += 1
    try:
        yield
    finally:
        _checkpoint_ops -= 1
        _saving = previous
        if flip:
            args.ckpt_format = previous_format


def _safetensors_on_disk(load_dir) -> bool:
    """``load_dir``'s latest checkpoint (by its tracker) is a safetensors checkpoint."""
    from pathlib import Path

    from adaptor.checkpoint import files

    tracker = Path(load_dir or "") / files.TRACKER
    try:
        text = tracker.read_text().strip()
    except OSError:
        return False
    name = files.tracked_dir_name(text)
    return name is not None and files.is_safetensors_checkpoint(tracker.parent / name)


@contextlib.contextmanager
def _one_line_errors(where: str):
    """A bad checkpoint (or state that cannot be stored) ends the run with one line naming file and tensor."""
    from adaptor.checkpoint.errors import CheckpointError
    from adaptor.checkpoint.object_codec import EncodeError
    from adaptor.checkpoint.serialization import SaveFailed
    from adaptor.errors import fail

    try:
        yield
    except SaveFailed:
        raise  # nothing was committed: patches/checkpoint/save_failures.py decides whether the run goes on
    except (CheckpointError, EncodeError) as exc:
        fail(f"{where}: {exc}")


def _save_checkpoint(wrapped, instance, call_args, kwargs):
    global _pending_request
    from megatron.training import get_args

    args = get_args()
    if args.ckpt_format != FORMAT:
        with _checkpoint_operation(args, saving=False):
            return wrapped(*call_args, **kwargs)
    if args.async_save:
        from megatron.training.async_utils import maybe_finalize_async_save

        maybe_finalize_async_save(blocking=True)  # the next save waits for the previous one
    _pending_request = None
    with _one_line_errors(f"saving a checkpoint to {args.save}"), _checkpoint_operation(args, saving=True):
        result = wrapped(*call_args, **kwargs)
    request, _pending_request = _pending_request, None
    if args.keep_checkpoint_max and not kwargs.get("non_persistent_ckpt", False):
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_rank() == 0:
            from adaptor.checkpoint.retention import prune

            prune_fn = functools.partial(prune, args.save, args.keep_checkpoint_max, args.save_retain_interval)
            if request is not None:
                request.finalize_fns.append(prune_fn)  # after Megatron's tracker update
            else:
                prune_fn()
    return result


def _load_checkpoint(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    args = get_args()
    load_dir = getattr(args, kwargs.get("load_arg", "load"), None)
    # A safetensors checkpoint (tools/convert_ckpt.py's default output) loads under --ckpt-format torch too.
    sharded = args.ckpt_format == "torch" and _safetensors_on_disk(load_dir)
    with _one_line_errors(f"loading the checkpoint under {load_dir}"), \
            _checkpoint_operation(args, saving=False, sharded_on_disk=sharded):
        return wrapped(*call_args, **kwargs)


def _dist_save(wrapped, instance, call_args, kwargs):
    global _pending_request
    if not _saving:
        return wrapped(*call_args, **kwargs)
    from adaptor.checkpoint import serialization

    _pending_request = serialization.save(*call_args, **kwargs)
    return _pending_request


def _dispatch_on_directory(name: str, position: int):
    """A wrapper for ``dist_checkpointing.<name>``: our reader when the directory holds a safetensors checkpoint."""
    def wrapper(wrapped, instance, call_args, kwargs):
        from adaptor.checkpoint import files, serialization

        directory = call_args[position] if len(call_args) > position else kwargs.get("checkpoint_dir")
        if directory is not None and files.is_safetensors_checkpoint(directory):
            return getattr(serialization, name)(*call_args, **kwargs)
        return wrapped(*call_args, **kwargs)
    wrapper.__name__ = f"_{name}"
    return wrapper


def _sharding_metadata(wrapped, instance, call_args, kwargs):
    metadata = wrapped(*call_args, **kwargs)
    if _saving and metadata.get("distrib_optim_sharding_type") == "dp_reshardable":
        metadata["distrib_optim_sharding_type"] = "fully_sharded_model_space"
    return metadata


def _swiglu_factory(wrapped, instance, call_args, kwargs):
    factory = wrapped(*call_args, **kwargs)
    original = argument(call_args, kwargs, "original_sh_ten")
    if getattr(original, "is_torch_fsdp2_param", False):
        return factory  # FSDP2's own build; its shards are never flattened
    from adaptor.checkpoint.flat_shards import with_flat_ranges

    offsets = call_args[1] if len(call_args) > 1 else kwargs["sharded_offsets"]
    singleton = call_args[2] if len(call_args) > 2 else kwargs.get("singleton_local_shards", False)
    return with_flat_ranges(factory, original, offsets, singleton)


def _set_main_param_and_optimizer_states(wrapped, instance, call_args, kwargs):
    model_param = argument(call_args, kwargs, "model_param")
    tensors = call_args[1] if len(call_args) > 1 else kwargs["tensors"]
    group_index, group_order = instance.model_param_group_index_map[model_param]
    main_param = instance.optimizer.param_groups[group_index]["params"][group_order]
    # States the model-space layout does not store (torch Adam's per-parameter ``step``, which
    # Megatron restores from the param groups) are left as they are instead of raising KeyError.
    missing = {key: None for key in instance.optimizer.state.get(main_param, {}) if key not in tensors}
    return wrapped(model_param, {**missing, **tensors})


def _validate_metadata_integrity(wrapped, instance, call_args, kwargs):
    if instance.flattened_range is None or not _checkpoint_ops:
        return wrapped(*call_args, **kwargs)
    from adaptor.checkpoint.validation import validate_flat_metadata

    validate_flat_metadata(wrapped, instance)


class SafetensorsFormat(Feature):
    name = "safetensors_format"

    def add_arguments(self, group) -> None:
        # Megatron's own --ckpt-format gains a choice (its action lives in the parser this group belongs to).
        for action in group._actions:
            if {"--ckpt-format", "--ckpt-convert-format"} & set(action.option_strings) and action.choices \
                    and FORMAT not in action.choices:
                action.choices = (*action.choices, FORMAT)
                action.help = (action.help or "") + " safetensors: sharded safetensors files, no pickle (megatron-adaptor)."
        group.add_argument("--keep-checkpoint-max", type=int, default=None, dest="keep_checkpoint_max", metavar="N",
                           help="Keep at most N finished checkpoints under --save (--ckpt-format safetensors): the "
                                "oldest is deleted only after a newer one is complete; checkpoints kept by "
                                "--save-retain-interval do not count.")

    def register_patches(self, pm, ctx) -> None:
        ckpt = "megatron.training.checkpointing"
        serial = "megatron.core.dist_checkpointing.serialization"
        pm.register_wrapper(f"{ckpt}.save_checkpoint", _save_checkpoint, OWNER)
        pm.register_wrapper(f"{ckpt}.load_checkpoint", _load_checkpoint, OWNER)
        pm.register_wrapper(f"{ckpt}._build_sharded_state_dict_metadata", _sharding_metadata, OWNER)
        pm.register_wrapper(f"{serial}.save", _dist_save, OWNER)
        # Where each function takes the checkpoint directory.
        for name, position in (("load", 1), ("load_common_state_dict", 0), ("load_tensors_metadata", 0),
                               ("load_sharded_metadata", 0)):
            pm.register_wrapper(f"{serial}.{name}", _dispatch_on_directory(name, position), OWNER)
        pm.register_wrapper("megatron.core.dist_checkpointing.mapping.ShardedTensor.validate_metadata_integrity",
                            _validate_metadata_integrity, OWNER)
        pm.register_wrapper("megatron.core.transformer.mlp.apply_swiglu_sharded_factory", _swiglu_factory, OWNER)
        pm.register_wrapper("megatron.core.optimizer.distrib_optimizer.DistributedOptimizer."
                            "_set_main_param_and_optimizer_states", _set_main_param_and_optimizer_states, OWNER)

    def set_defaults(self, args, ctx) -> None:
        if getattr(args, "ckpt_format", None) != FORMAT or not getattr(args, "async_save", False):
            return
        # Megatron runs async saves only in its persistent checkpoint worker, and its default queue
        # needs nvidia-resiliency-ext; our writer needs neither, so use Megatron's own worker.
        if "async_strategy" not in ctx.explicit:
            args.async_strategy = "mcore"
        if "use_persistent_ckpt_worker" not in ctx.explicit:
            args.use_persistent_ckpt_worker = True

    def validate(self, args, ctx) -> None:
        keep = args.keep_checkpoint_max
        if keep is not None and keep < 1:
            raise ArgumentError(f"--keep-checkpoint-max must be at least 1 (got {keep})")
        if args.ckpt_format != FORMAT:
            if keep is not None:
                raise ArgumentError("--keep-checkpoint-max needs --ckpt-format safetensors")
            return
        if getattr(args, "use_megatron_fsdp", False):
            raise ArgumentError("--ckpt-format safetensors does not support --use-megatron-fsdp "
                                "(it needs --ckpt-format fsdp_dtensor)")
        if getattr(args, "verify_integrity", False):
            raise ArgumentError("--verify-integrity is a torch_dist feature; safetensors files are checked "
                                "against their headers on every load")
