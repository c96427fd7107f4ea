"""Hugging Face safetensors directories, read with zero copies.

The Hub's directory layout (one ``model.safetensors``, or shards plus ``model.safetensors.index.json``)
is read by :class:`adaptor.checkpoint.consolidated.ShardedTensors`; a Hugging Face directory adds config.json.
They are written by :mod:`adaptor.convert.hf_writer`.
"""
from __future__ import annotations

import json
from pathlib import Path

from adaptor.checkpoint.consolidated import ShardedTensors
from adaptor.convert.errors import ConversionError


class HfCheckpoint(ShardedTensors):
    """A Hub-style directory with config.json (:attr:`config`): model.safetensors, or shards +
    model.safetensors.index.json, read as :class:`~adaptor.checkpoint.consolidated.ShardedTensors` reads them."""

    error, confined = ConversionError, False

    def __init__(self, path):
        path = Path(path)
        if not path.is_dir():
            raise ConversionError(f"{path}: not a directory")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ConversionError(f"{config_file}: missing (a Hugging Face checkpoint needs config.json)")
        try:
            self.config: dict = json.loads(config_file.read_text())
        except json.JSONDecodeError as exc:
            raise ConversionError(f"{config_file}: not valid JSON ({exc})") from exc
        super().__init__(path)
