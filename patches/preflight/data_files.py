"""Every dataset a run will train on, checked from its headers before anything is built.

Upstream: ``megatron.core.datasets.indexed_dataset._IndexReader`` asserts on a bad ``.idx``
header (``AssertionError: bad header``) when the dataset builder runs, after the model and
optimizer, and nothing compares a ``.bin`` with its index: a copy cut short trains until a
DataLoader worker reads past its end, mid-run, with a traceback. This feature changes no
upstream function; its check (:mod:`adaptor.preflight.data_sources`) runs at argument
validation on every rank, and reads ``--data-args-path`` / ``--per-split-data-args-path``
the way ``get_blend_and_blend_per_split`` will.
"""
from __future__ import annotations

from adaptor.features import Feature
from adaptor.preflight.data_sources import check_data_sources


class DataFiles(Feature):
    name = "data_files"

    def validate(self, args, ctx) -> None:
        check_data_sources(args)
