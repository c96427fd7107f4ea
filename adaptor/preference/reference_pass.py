"""DPO's reference pass: the frozen reference runs through Megatron's own schedule before the policy.

The reference's sequence log-probabilities of a micro-batch are needed by the policy's loss, on the last
pipeline stage, while the reference's activations have to cross the same stages as the policy's. So each
call of Megatron's forward-backward function (a training step, or an evaluation step) becomes two calls
of that same function over the same micro-batches:

1. the step's ``num_microbatches`` items are taken from the data iterator once;
2. the reference (``forward_only=True``, under ``no_grad``) replays them with the reference's forward step,
   whose loss function hands the reference's values back through the schedule's returned list (last
   stage only; the other stages get nothing);
3. the policy replays them with the run's forward step, whose loss function takes the values back in
   micro-batch order with :meth:`ReferencePass.pop`. Every schedule runs a stage's micro-batches in
   order, so order is all that ties a value to its micro-batch.

A forward step opts in by carrying two attributes: ``rows_per_sample`` (a DPO sample is a chosen and a
rejected row, so the tensors passed between stages hold twice ``--micro-batch-size`` rows) and
``reference_pass`` (a :class:`ReferencePass`, absent when the values come from a file). A reference
pass may carry ``before_first``, run once at the first call with Megatron's schedule and its arguments
(``--precompute-ref-logps``, which may hand the run over to stored values). Other forward steps run
unchanged.
"""
from __future__ import annotations

import collections
import functools
from typing import Callable, ContextManager, Optional

import torch

VALUES = "reference logps"  # the reference loss function's key in the schedule's returned list


class ReferencePass:
    """Runs the reference over a step's micro-batches and queues its values for the policy's loss."""

    def __init__(self, step: Callable, models: Callable[[list], ContextManager[list]],
                 before_first: Optional[Callable] = None) -> None:
        """``step`` is the reference's forward step (its loss function returns ``{VALUES: tensor}`` as the
        reduced item); ``models(policy)`` is a context manager giving the model chunks to run it on
        (a frozen copy, or the policy itself with its adapters off); ``before_first(schedule, kwargs)``
        runs once, before the first step's passes."""
        self.step, self.models, self.before_first = step, models, before_first
        self.values: collections.deque = collections.deque()

    def run(self, schedule: Callable, kwargs: dict, items: Optional[list]) -> None:
        reference_kwargs = dict(kwargs, forward_step_func=self.step, data_iterator=replay(items),
                                forward_only=True)
        with torch.no_grad(), self.models(kwargs["model"]) as reference:
            reduced = schedule(**dict(reference_kwargs, model=reference))
        self.values.extend(item[VALUES] for item in reduced or ())

    def pop(self) -> torch.Tensor:
        """The next micro-batch's reference values (policy's loss function, last stage)."""
        if not self.values:
            raise RuntimeError("the DPO policy pass asked for the reference's values of a micro-batch the "
                               "reference pass did not see")
        return self.values.popleft()


class PerChunk(list):
    """What :func:`take` read from Megatron's list of per-chunk iterators: one entry per model chunk."""


def take(data_iterator, count: int):
    """The next ``count`` items of ``data_iterator`` (None where this rank reads no data). With virtual
    pipeline stages Megatron gives one iterator per model chunk (None for chunks that read no data), each
    over the same samples: every one is read ``count`` times, as the chunks' forward steps would."""
    if isinstance(data_iterator, list):
        return PerChunk(take(one, count) for one in data_iterator)
    if data_iterator is None:
        return None
    return [next(data_iterator) for _ in range(count)]  # Megatron's RerunDataIterator has no __iter__


def replay(items):
    """Iterators over what :func:`take` read, in its shape (one, or one per model chunk)."""
    if isinstance(items, PerChunk):
        return [replay(one) for one in items]
    return None if items is None else iter(items)


def with_reference_pass(schedule: Callable) -> Callable:
    """``schedule`` (a function from Megatron's ``get_forward_backward_func``) for forward steps that
    declare ``rows_per_sample`` / ``reference_pass`` (module doc); unchanged for the others."""

    @functools.wraps(schedule)
    def run(**kwargs):
        step = kwargs["forward_step_func"]
        rows = getattr(step, "rows_per_sample", 1)
        if rows != 1:
            kwargs = dict(kwargs, micro_batch_size=kwargs["micro_batch_size"] * rows)
        reference: Optional[ReferencePass] = getattr(step, "reference_pass", None)
        if reference is not None and reference.before_first is not None:
            first, reference.before_first = reference.before_first, None
            first(schedule, kwargs)
            reference = getattr(step, "reference_pass", None)  # it may have handed over to stored values
        if reference is None:
            return schedule(**kwargs)
        items = take(kwargs["data_iterator"], kwargs["num_microbatches"])
        reference.run(schedule, kwargs, items)
        return schedule(**dict(kwargs, data_iterator=replay(items)))

    return run
