"""``save`` / ``load`` with the signatures of ``megatron.core.dist_checkpointing.save/load``, writing safetensors.

Megatron's own checkpointing (``megatron.training.checkpointing``) builds the sharded state dict
(model, optimizer, RNG, rerun state, scheduler, arguments) and decides everything about *what* is
saved; these two functions decide *how* it is stored. Megatron's preprocessing (factories,
non-persistent entries, common/sharded split) and its strictness handling are reused as they are.
"""
from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from adaptor.checkpoint import files
from adaptor.checkpoint.errors import CheckpointError
from adaptor.checkpoint.optimizer_forms import reconcile
from adaptor.checkpoint.reader import CheckpointIndex
from adaptor.checkpoint.validation import validate_sharding
from adaptor.checkpoint.writer import common_payload, rank_payload, write_payload
from adaptor import log


def _layout(world: int, common_state: dict) -> dict:
    """Readable facts for common.json: what a person (or a tool) asks of a checkpoint first."""
    from megatron.core import parallel_state as mpu

    args = common_state.get("args")
    sizes = {}
    if mpu.model_parallel_is_initialized():
        sizes = {
            "tensor_model_parallel_size": mpu.get_tensor_model_parallel_world_size(),
            "pipeline_model_parallel_size": mpu.get_pipeline_model_parallel_world_size(),
            "data_parallel_size": mpu.get_data_parallel_world_size(),
            "context_parallel_size": mpu.get_context_parallel_world_size(),
            "expert_model_parallel_size": mpu.get_expert_model_parallel_world_size(),
        }
    return {
        "command_line": sys.argv,  # what split replays at another layout (tools/safetensors_ckpt.py)
        "iteration": common_state.get("iteration"),
        "consumed_train_samples": getattr(args, "consumed_train_samples", None),
        "world_size": world,
        "parallel": sizes,
        "files": [files.rank_file(r) for r in range(world)],
    }


class SaveFailed(CheckpointError):
    """A save that did not complete on some rank; the staging directory is gone, older checkpoints untouched."""

    def __init__(self, checkpoint_dir: str, reason: str) -> None:
        super().__init__(f"saving {checkpoint_dir} failed: {reason}")
        self.checkpoint_dir, self.reason = checkpoint_dir, reason


_FAILURE_NOTE = ".failed-rank-{:05d}"
_write_error: dict[str, str] = {}  # staging dir -> this process's write error (sync saves)


def _write_or_note(staging: str, payloads: list, rank: int) -> None:
    """write_payload, turning an OSError (no space, file too large, I/O error) into a note beside the files.

    An async save runs this in Megatron's checkpoint worker, a separate process: the note is how
    the failure reaches the finalize step, which every rank runs together. When even the note
    cannot be written, finalize finds the rank file incomplete instead.
    """
    try:
        write_payload(staging, payloads)
    except OSError as exc:
        reason = f"{exc.filename or staging}: {exc.strerror or exc}"
        _write_error[staging] = reason
        try:
            (Path(staging) / _FAILURE_NOTE.format(rank)).write_text(reason)
        except OSError:
            pass


def _local_failure(staging: Path, rank: int) -> str | None:
    from adaptor.safetensors_file import SafetensorsError, SafetensorsFile

    if str(staging) in _write_error:
        return _write_error.pop(str(staging))
    note = staging / _FAILURE_NOTE.format(rank)
    if note.exists():
        return note.read_text() or "the write failed"
    try:
        SafetensorsFile(staging / files.rank_file(rank)).close()
    except SafetensorsError as exc:
        return str(exc)
    return None


def _finalize(checkpoint_dir: str) -> None:
    """After every rank has written: all agree the write succeeded, then rank 0 makes the checkpoint visible.

    If any rank failed, no rank commits: rank 0 removes the staging directory (and the empty
    directory Megatron made for this iteration), and every rank raises :class:`SaveFailed` with
    the first failing rank's reason. The tracker file still names the previous checkpoint.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    staging = files.staging_dir(checkpoint_dir)
    failures = [None] * world
    dist.all_gather_object(failures, _local_failure(staging, rank))
    failed = [(r, reason) for r, reason in enumerate(failures) if reason]
    if failed:
        if rank == 0:
            files.discard_staging(checkpoint_dir)
        dist.barrier()
        first, reason = failed[0]
        raise SaveFailed(str(checkpoint_dir), f"rank {first}: {reason}" if world > 1 else reason)
    if rank == 0:
        files.commit(checkpoint_dir)
        size = sum(p.stat().st_size for p in Path(checkpoint_dir).iterdir())
        # Megatron's own line says "torch_dist": its sharded path runs, and the storage is ours.
        log.every_rank(f"{checkpoint_dir}: stored as safetensors, {world} rank files, {size / 1e9:.3f} GB")
    dist.barrier()


def save(sharded_state_dict, checkpoint_dir, sharded_strategy=None, validate_access_integrity: bool = True,
         async_sharded_save: bool = False, preprocess_common_before_consistancy_check=None,
         content_metadata=None, async_strategy=None, verify_integrity: bool = False):
    """Write this rank's part of ``sharded_state_dict``; returns an AsyncRequest when ``async_sharded_save``.

    Every rank writes its main replicas into the checkpoint's staging directory; rank 0 also
    writes the common state. With a fully-parallel save strategy (Megatron's default), replicated
    shards are spread over the data-parallel ranks so each is written once and the work is shared.
    """
    from megatron.core.dist_checkpointing.exchange_utils import determine_main_replica_uniform_distribution
    from megatron.core.dist_checkpointing.state_dict_utils import save_preprocess
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
        distribute_main_replicas_with_precomputed_distribution,
    )
    from megatron.core.dist_checkpointing.utils import _clean_metadata_for_serialization
    from megatron.core.dist_checkpointing.validation import _validate_common_state_dict, determine_global_metadata

    rank, world = dist.get_rank(), dist.get_world_size()
    if content_metadata is not None:
        sharded_state_dict["content_metadata"] = content_metadata
    sharded_part, common_state = save_preprocess(sharded_state_dict, validate_access_integrity=False)
    if "content_metadata" in common_state:
        common_state["content_metadata"] = _clean_metadata_for_serialization(common_state["content_metadata"])
    if validate_access_integrity:
        checked = common_state
        if preprocess_common_before_consistancy_check is not None:
            checked = preprocess_common_before_consistancy_check(common_state)
        _validate_common_state_dict(checked)
    if isinstance(sharded_strategy, FullyParallelSaveStrategyWrapper):
        group = sharded_strategy.parallelization_group
        distribution = determine_main_replica_uniform_distribution(sharded_part, group)
        distribute_main_replicas_with_precomputed_distribution(sharded_part, group, distribution)
    if validate_access_integrity:
        validate_sharding(determine_global_metadata(sharded_part)[1])

    payloads = [rank_payload(sharded_part, rank, snapshot=async_sharded_save)]
    if rank == 0:
        payloads.append(common_payload(common_state, _layout(world, common_state), snapshot=async_sharded_save))
    staging = files.staging_dir(checkpoint_dir)
    if rank == 0:
        files.prepare_staging(checkpoint_dir)
    dist.barrier()
    finalize = functools.partial(_finalize, str(checkpoint_dir))
    if not async_sharded_save:
        _write_or_note(str(staging), payloads, rank)
        finalize()
        return None
    return AsyncRequest(_write_or_note, (str(staging), payloads, rank), [finalize])


def load_common_state_dict(checkpoint_dir) -> dict:
    return CheckpointIndex(checkpoint_dir).common_state()


def load(sharded_state_dict, checkpoint_dir, sharded_strategy=None, validate_access_integrity: bool = True,
         strict=None, verify_integrity: bool = False, process_group=None):
    """Fill ``sharded_state_dict`` from the checkpoint at whatever layout this run uses.

    Tensors whose requested shard already has a buffer (model parameters, optimizer state) are
    copied into it; the result is Megatron's state dict: the common state with the loaded
    tensors and objects merged in.
    """
    from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace, merge
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factory_merges
    from megatron.core.dist_checkpointing.state_dict_utils import load_preprocess
    from megatron.core.dist_checkpointing.utils import extract_sharded_base
    from megatron.core.dist_checkpointing.validation import (
        StrictHandling,
        determine_global_metadata,
        parse_strict_flag,
        validate_integrity_and_strict_load,
    )

    index = CheckpointIndex(checkpoint_dir)
    sharded_state_dict, nonpersistent, factories = load_preprocess(sharded_state_dict)
    common = index.common_state()
    sharded_state_dict, requested_common = extract_sharded_base(sharded_state_dict)
    if isinstance(common.get("optimizer"), dict) and isinstance(requested_common.get("optimizer"), dict):
        try:  # saved with the distributed optimizer and loaded without it, or the reverse
            common["optimizer"] = reconcile(common["optimizer"], requested_common["optimizer"])
        except ValueError as exc:
            raise CheckpointError(f"{checkpoint_dir}: {exc}") from None
    merge(common, nonpersistent)

    strict = parse_strict_flag(StrictHandling.ASSUME_OK_UNEXPECTED if strict is None else strict)
    ckpt_metadata = index.sharded_metadata() if StrictHandling.requires_explicit_ckpt_mismatch_check(strict) else None
    local_metadata = global_metadata = None
    if validate_access_integrity or StrictHandling.requires_global_app_metadata(strict):
        local_metadata, global_metadata = determine_global_metadata(sharded_state_dict, process_group=process_group)
    sharded_state_dict, missing, unexpected = validate_integrity_and_strict_load(
        sharded_state_dict, strict, False, local_metadata, global_metadata, ckpt_metadata)
    if validate_access_integrity:
        validate_sharding(global_metadata)

    def load_one(item):
        if isinstance(item, ShardedObject):
            return index.load_object(item)
        if not isinstance(item, ShardedTensor):
            return item
        data = item.data
        expected = item.local_shape if item.flattened_range is None else (len(range(*item.flattened_range.indices(
            math.prod(item.local_shape)))),)
        fits = data is not None and tuple(data.shape) == tuple(expected) and data.dtype == item.dtype
        with torch.no_grad():
            if fits and data.device.type == "cpu" and data.is_contiguous():
                return index.load_tensor(item, into=data)  # straight into the parameter / optimizer state
            tensor = index.load_tensor(item)
            if fits:
                data.copy_(tensor)
                return data
        return tensor

    try:
        loaded = dict_list_map_inplace(load_one, sharded_state_dict)
    finally:
        index.close()
    merge(common, loaded)
    common = apply_factory_merges(common, factories)
    if StrictHandling.requires_returning_mismatch_keys(strict):
        return common, missing, unexpected
    return common


def load_tensors_metadata(checkpoint_dir, sharded_strategy=None) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return {k: v for k, v in CheckpointIndex(checkpoint_dir).sharded_metadata().items() if isinstance(v, ShardedTensor)}


def load_sharded_metadata(checkpoint_dir, sharded_strategy=None) -> dict:
    return CheckpointIndex(checkpoint_dir).sharded_metadata()


def is_checkpoint(checkpoint_dir) -> bool:
    return files.is_safetensors_checkpoint(checkpoint_dir)

