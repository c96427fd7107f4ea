#!/usr/bin/env python
"""Print the Megatron architecture flags of a Hugging Face model directory, one token per line.

    python tools/hf_model_flags.py /models/Qwen3-0.6B

The first line is the vocabulary size; then the flags (and their values) that build the same
architecture, as ``--hf-load-dir`` checks them (``adaptor.convert.config_check.model_flags``),
without ``--vocab-size`` and ``--max-position-embeddings``, which the caller chooses. The example
scripts read it with ``mapfile``. A directory without a readable config.json is one line on
stderr and exit status 2.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
PROG = "hf_model_flags.py"
LEFT_TO_CALLER = ("--vocab-size", "--max-position-embeddings")


def flag_lines(hf_dir: str) -> list[str]:
    from adaptor.convert.config_check import HF_MODEL_TYPES, model_flags

    config = json.loads((Path(hf_dir) / "config.json").read_text())
    flags = model_flags(HF_MODEL_TYPES.get(config.get("model_type"), "qwen3"), config)
    lines = [str(config["vocab_size"])]
    for flag, value in zip(flags, flags[1:] + [""]):
        if flag.startswith("--") and flag not in LEFT_TO_CALLER:
            lines.append(flag)
            if value and not value.startswith("--"):
                lines.append(value)
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"{PROG}: error: usage: {PROG} HF_DIR", file=sys.stderr)
        return 2
    try:
        print("\n".join(flag_lines(argv[0])))
    except Exception as exc:  # a missing file, bad JSON, an unsupported architecture: one line
        print(f"{PROG}: error: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    os.environ.setdefault("ADAPTOR_BACKEND", "cpu")
    import warnings

    warnings.filterwarnings("ignore")
    sys.exit(main())
