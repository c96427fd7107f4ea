"""A distributed-optimizer checkpoint that Megatron cannot read at this run's layout ends the run in one
line with Megatron's reason (which names the flag to save with), status 1; any other RuntimeError of
``load_checkpoint`` stays a traceback. The wrapper is the one patches/preflight/checkpoint_inputs.py
puts around megatron.training.checkpointing.load_checkpoint; Megatron's message is quoted from
megatron/training/checkpointing.py (megatron-core 0.19.2).
"""
from __future__ import annotations

import pytest

from patches.preflight.checkpoint_inputs import _exit_status_kept

MEGATRONS = ("(TP, PP) mismatch after resume ((2, 1) vs (1, 2) from checkpoint): not supported for "
             "DistributedOptimizer with sharding type dp_reshardable. Please use `--ckpt-fully-parallel-save` "
             "flag during checkpoint saving.")


def raising(exc):
    def load_checkpoint(*args, **kwargs):
        raise exc
    return load_checkpoint


def test_a_layout_refusal_is_one_line_with_status_1(capsys):
    with pytest.raises(SystemExit) as exit_:
        _exit_status_kept(raising(RuntimeError(MEGATRONS)), None, (), {})
    assert exit_.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["megatron-adaptor: error: the checkpoint does not fit this run: " + MEGATRONS], lines


def test_other_runtime_errors_keep_their_traceback():
    with pytest.raises(RuntimeError, match="^a defect$"):
        _exit_status_kept(raising(RuntimeError("a defect")), None, (), {})
