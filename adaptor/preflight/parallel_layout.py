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
