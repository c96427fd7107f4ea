"""``recompute_modules``: activation checkpointing of chosen modules under FSDP2.

The module's ``forward`` is replaced on the instance by one that runs the original through
``torch.utils.checkpoint`` (non-reentrant), so the module tree, its parameter names and
Megatron's ``sharded_state_dict`` stay as they were (a wrapper module would rename every
parameter below it). FSDP2's hooks sit on ``__call__`` around this ``forward``: the unit's
parameters are gathered for the forward and gathered again, by its pre-backward hook,
before the recompute.

The recompute must draw the same random numbers as the forward. torch's checkpoint restores
the default CPU and device generators; Megatron's tensor-parallel dropout draws from its own
RNG tracker (``get_cuda_rng_tracker()``), which it forks per region. Megatron's own
``tensor_parallel.checkpoint`` saves and restores the tracker's states too; ``_tracker_contexts``
does the same here: the forward records the tracker's states, the recompute runs from them
and then puts back the states the tracker had reached.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.checkpoint import checkpoint


def _tracker_contexts():
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    recorded = {}

    @contextlib.contextmanager
    def forward():
        recorded.update(tracker.get_states())
        yield

    @contextlib.contextmanager
    def recompute():
        reached = tracker.get_states()
        tracker.set_states(dict(recorded))
        try:
            yield
        finally:
            tracker.set_states(reached)

    return forward(), recompute()


def checkpoint_forward(module: torch.nn.Module) -> None:
    """Make ``module`` recompute its forward during backward instead of keeping activations."""
    original = module.forward

    @functools.wraps(original)
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        return checkpoint(original, *args, use_reentrant=False, context_fn=_tracker_contexts, **kwargs)

    module.forward = forward
