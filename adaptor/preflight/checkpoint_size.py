"""How many bytes one checkpoint of this run will take, estimated from the arguments alone.

The parameter count comes from megatron-core's own estimator
(``megatron.training.theoretical_memory_usage.compute_weight_and_optimizer_memory``), asked
about a copy of the arguments at one rank without a distributed optimizer, where it counts
every parameter once at 18 bytes each. A checkpoint stores each parameter once in its
training dtype, plus, unless ``--no-save-optim``, the fp32 main copy (mixed precision only)
and the optimizer's moments (Adam two, SGD one).

When the estimator raises (arguments it cannot count), :class:`EstimateFailed` carries its error, so
the caller says the check did not run and why instead of passing in silence.
"""
from __future__ import annotations

import contextlib
import copy
import io

_MEGATRON_BYTES_PER_PARAM = 18  # the estimator's figure without a distributed optimizer


class EstimateFailed(Exception):
    """megatron-core's estimator raised on these arguments; the text is its error, on one line."""


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def parameter_count(args) -> int:
    """Total parameters of the model the arguments describe (:class:`EstimateFailed` when the estimator raises)."""
    from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

    one = copy.copy(args)
    for dest in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
                 "expert_tensor_parallel_size", "world_size", "data_parallel_size", "context_parallel_size"):
        setattr(one, dest, 1)
    one.use_distributed_optimizer = False
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            total = compute_weight_and_optimizer_memory(one, verbose=False)
    except Exception as exc:  # arguments the estimator cannot count: the caller says so
        raise EstimateFailed(one_line(exc)) from exc
    return int(total / _MEGATRON_BYTES_PER_PARAM)


def checkpoint_bytes(args) -> int:
    params = parameter_count(args)
    weight = 2 if (getattr(args, "bf16", False) or getattr(args, "fp16", False)) else 4
    per_param = weight
    if not getattr(args, "no_save_optim", False):
        main = 4 if weight == 2 else 0
        moments = 4 if getattr(args, "optimizer", "adam") == "sgd" else 8
        per_param += main + moments
    return params * per_param
