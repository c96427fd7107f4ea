"""A parallel layout Megatron would reject deep inside ``validate_args``, as one line naming the flags.

``--ckpt-format torch_dcp`` is a layout question too: Megatron asserts it runs with
``--use-torch-fsdp2`` and without tensor (or pipeline) parallelism, because it stores each
parameter under its own name as FSDP2's DTensor; a tensor-parallel shard is a plain tensor that
would be written under the whole parameter's name.

Torch-free: the entry files' command line is checked with it before the imports (the world size
comes from torchrun's ``WORLD_SIZE``), and again by the argument_checks feature inside Megatron's
parsing, so a wrong ``--nproc_per_node`` is answered in a second on every rank at once.
"""
from __future__ import annotations

from adaptor.errors import ArgumentError


def check_parallel_layout(args) -> None:
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    cp = getattr(args, "context_parallel_size", 1) or 1
    model_size = tp * pp * cp
    if args.world_size % model_size != 0:
        raise ArgumentError(
            f"world size {args.world_size} is not divisible by --tensor-model-parallel-size {tp} "
            f"x --pipeline-model-parallel-size {pp} x --context-parallel-size {cp} = {model_size}; "
            f"change --nproc_per_node (or the number of nodes) or these sizes"
        )
    if args.num_attention_heads is not None and args.num_attention_heads % tp != 0:
        raise ArgumentError(
            f"--num-attention-heads {args.num_attention_heads} is not divisible by "
            f"--tensor-model-parallel-size {tp}"
        )
    groups = args.num_query_groups if args.group_query_attention else None
    if groups and groups % tp != 0:
        raise ArgumentError(f"--num-query-groups {groups} is not divisible by --tensor-model-parallel-size {tp}")
    if getattr(args, "ckpt_format", None) == "torch_dcp":
        if not getattr(args, "use_torch_fsdp2", False):
            raise ArgumentError("--ckpt-format torch_dcp is Megatron's checkpoint format for --use-torch-fsdp2; "
                                "without FSDP2 use --ckpt-format torch_dist or safetensors")
        if tp > 1:
            raise ArgumentError(f"--ckpt-format torch_dcp does not support --tensor-model-parallel-size {tp} "
                                f"(its tensor-parallel shards are plain tensors, not DTensors, and would "
                                f"be written under the whole parameter's name); "
                                f"use --ckpt-format torch_dist or safetensors")
    _check_expert_layout(args, tp, pp)
    _check_optimizer_instances(args, args.world_size // model_size * cp, tp, pp)


def _expert_sizes(args, tp: int, pp: int) -> tuple[int, int, int]:
    """(expert tensor-parallel size, expert model-parallel size, expert_tensor x expert_model x pipeline)."""
    etp = getattr(args, "expert_tensor_parallel_size", None) or tp  # Megatron's default: the TP size
    ep = getattr(args, "expert_model_parallel_size", 1) or 1
    return etp, ep, etp * ep * pp


def _check_expert_layout(args, tp: int, pp: int) -> None:
    # megatron.core.parallel_state.initialize_model_parallel raises a RuntimeError with a traceback
    etp, ep, size = _expert_sizes(args, tp, pp)
    if args.world_size % size != 0:
        raise ArgumentError(
            f"world size {args.world_size} is not divisible by --expert-tensor-parallel-size {etp} "
            f"x --expert-model-parallel-size {ep} x --pipeline-model-parallel-size {pp} = {size}; "
            f"change --nproc_per_node (or the number of nodes) or these sizes")


def _check_optimizer_instances(args, dp_cp: int, tp: int, pp: int) -> None:
    """Megatron splits both data-parallel domains into the instances, asserting while it builds the groups."""
    instances = getattr(args, "num_distributed_optimizer_instances", 1)
    if instances is None or instances == 1:
        return
    flag = f"--num-distributed-optimizer-instances {instances}"
    if instances < 1:
        raise ArgumentError(f"{flag}: the number of optimizer copies must be at least 1")
    if dp_cp % instances != 0:
        raise ArgumentError(
            f"{flag} does not divide the data-parallel x context-parallel size {dp_cp} (world size "
            f"{args.world_size} / (--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp})); "
            f"use a divisor of {dp_cp}")
    etp, ep, size = _expert_sizes(args, tp, pp)
    edp = args.world_size // size
    if edp % instances != 0:
        raise ArgumentError(
            f"{flag} does not divide the expert data-parallel size {edp} (world size {args.world_size} / "
            f"(--expert-tensor-parallel-size {etp} x --expert-model-parallel-size {ep} x "
            f"--pipeline-model-parallel-size {pp})); use a divisor of {edp}, or a smaller --expert-model-parallel-size")
