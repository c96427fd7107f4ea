"""The one error conversion raises; tools/convert_ckpt.py prints it as one line."""
from __future__ import annotations


class ConversionError(Exception):
    """A checkpoint, config or layout that cannot be converted; the message names the file, tensor or setting."""
