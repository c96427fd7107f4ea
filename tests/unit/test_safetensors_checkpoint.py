"""--ckpt-format safetensors: the checks on its flags, each a one-line error.

Its codec, retention and shard assembly in this process: tests/unit/test_checkpoint_units.py. Through
Megatron's own loop (resume, kill, SIGTERM, resharding, async, retention, damaged checkpoints):
tests/e2e/test_safetensors_checkpoint.py.
"""
from __future__ import annotations

import re

import pytest


def test_flag_checks():
    """The flags' one-line errors (any feature's ArgumentError reaches the user as one line: test_bad_input)."""
    import argparse

    from adaptor.features import ArgumentError
    from patches.checkpoint.safetensors_format import SafetensorsFormat

    def check(**given):
        values = dict(keep_checkpoint_max=None, ckpt_format="safetensors", use_megatron_fsdp=False,
                      verify_integrity=False)
        SafetensorsFormat().validate(argparse.Namespace(**{**values, **given}), None)

    check(keep_checkpoint_max=3)
    for given, message in ((dict(keep_checkpoint_max=0), "--keep-checkpoint-max must be at least 1 (got 0)"),
                           (dict(keep_checkpoint_max=2, ckpt_format="torch_dist"),
                            "--keep-checkpoint-max needs --ckpt-format safetensors"),
                           (dict(use_megatron_fsdp=True), "does not support --use-megatron-fsdp"),
                           (dict(verify_integrity=True), "--verify-integrity is a torch_dist feature")):
        with pytest.raises(ArgumentError, match=re.escape(message)):
            check(**given)
