"""Early, one-line errors for parallel layouts Megatron would reject deep inside.

Upstream: ``megatron.training.arguments.validate_args`` asserts on parallel
layouts. These checks run before Megatron's validation (through
``adaptor.arguments_hook``) and name the flags involved (the world-size message
spells out the three parallel-size flags, not just their values, so the user
knows what to change). Files the run reads and writes are checked by the
features in ``patches/preflight/``.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature


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


class ArgumentChecks(Feature):
    name = "argument_checks"

    def validate(self, args, ctx) -> None:
        check_parallel_layout(args)
