"""The one error the safetensors checkpoint code raises for bad checkpoints or bad requests."""
from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint that cannot be written or read as asked; the message names the file, tensor or setting."""
