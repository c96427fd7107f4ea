"""Early, one-line errors for command lines Megatron would reject deep inside.

Upstream: ``megatron.training.arguments.validate_args`` asserts on parallel
layouts, and a missing ``--data-path`` file surfaces only when the dataset
builder opens it, as a traceback from ``indexed_dataset``. These checks run
before Megatron's validation (through ``adaptor.arguments_hook``) and name
the flags involved (the world-size message spells out the three parallel-size
flags, not just their values, so the user knows what to change). Blend
prefixes are read exactly as ``get_blend_from_list`` reads them: a quoted
``"0.5 a 0.5 b"`` used to be split here and pass when both files existed,
then fail in ``indexed_dataset`` as the one prefix Megatron actually opens.
"""
from __future__ import annotations

import os

from adaptor.features import ArgumentError, Feature


def _prefixes(paths):
    """Dataset prefixes of a Megatron blend: ``[w1, p1, w2, p2]`` or ``[p1, p2]``.

    Mirrors ``megatron.core.datasets.utils.get_blend_from_list``: each argument
    is one prefix (stripped, never split on spaces), so a quoted
    ``"0.5 a 0.5 b"`` is checked as the single prefix Megatron would open.
    """
    if not paths:
        return []
    paths = [str(item).strip() for item in paths]

    def is_weight(x):
        try:
            float(x)
            return True
        except ValueError:
            return False

    if len(paths) % 2 == 0 and all(is_weight(w) for w in paths[0::2]):
        return paths[1::2]
    return paths


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


def check_data_paths(args) -> None:
    if getattr(args, "mock_data", False):
        return
    for flag in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        for prefix in _prefixes(getattr(args, flag, None)):
            if "://" in prefix:
                continue  # object storage: checked by its own client
            missing = [ext for ext in (".bin", ".idx") if not os.path.isfile(prefix + ext)]
            if missing and len(prefix.split()) > 1:
                raise ArgumentError(
                    f"--{flag.replace('_', '-')}: {prefix!r} is one argument, so Megatron reads it as a single "
                    f"dataset prefix, which has no {' or '.join(missing)}; pass weights and prefixes as "
                    f"separate, unquoted arguments"
                )
            if missing:
                raise ArgumentError(
                    f"--{flag.replace('_', '-')}: dataset {prefix!r} has no {' or '.join(prefix + m for m in missing)}"
                )


class ArgumentChecks(Feature):
    name = "argument_checks"

    def validate(self, args, ctx) -> None:
        check_parallel_layout(args)
        check_data_paths(args)
