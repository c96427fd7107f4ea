"""How many bytes one checkpoint of this run will take, estimated from the arguments alone.

The parameter count comes from megatron-core's own estimator
(``megatron.training.theoretical_memory_usage.compute_weight_and_optimizer_memory``), asked
about a copy of the arguments at one rank without a distributed optimizer, where it counts
every parameter once at 18 bytes each. A checkpoint stores each parameter once in its
training dtype, plus, unless ``--no-save-optim``, the fp32 main copy (mixed precision only)
and the optimizer's moments (Adam two, SGD one).
"""
from __future__ import annotations

import contextlib
import copy
import io

_MEGATRON_BYTES_PER_PARAM = 18  # the estimator's figure without a distributed optimizer


def parameter_count(args) -> int | None:
    """Total parameters of the model the arguments describe; None when the estimator cannot tell."""
    from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

    one = copy.copy(args)
    for dest in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
                 "expert_tensor_parallel_size", "world_size", "data_parallel_size", "context_parallel_size"):
        setattr(one, dest, 1)
    one.use_distributed_optimizer = False
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            total = compute_weight_and_optimizer_memory(one, verbose=False)
    except Exception:  # an architecture the estimator does not know: no estimate, no check
        return None
    return int(total / _MEGATRON_BYTES_PER_PARAM)


def checkpoint_bytes(args) -> int | None:
    params = parameter_count(args)
    if params is None:
        return None
    weight = 2 if (getattr(args, "bf16", False) or getattr(args, "fp16", False)) else 4
    per_param = weight
    if not getattr(args, "no_save_optim", False):
        main = 4 if weight == 2 else 0
        moments = 4 if getattr(args, "optimizer", "adam") == "sgd" else 8
        per_param += main + moments
    return params * per_param
