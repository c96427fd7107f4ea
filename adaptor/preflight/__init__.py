"""Checks of everything a run will read or write, made before the first step.

A cluster job that fails after an hour for a reason visible at second one is the most
expensive bug a user meets. Each module here checks one kind of input and raises
:class:`adaptor.features.ArgumentError` with one sentence naming the file and what is
wrong; the features in ``patches/preflight/`` call them on every rank, before process
groups do real work, and :func:`adaptor.errors.fail` turns the sentence into the one
``megatron-adaptor: error:`` line and a non-zero exit.

The modules read only what they need (headers, sizes, small JSON/YAML files), so the
checks cost milliseconds even for terabyte datasets and checkpoints.
"""
