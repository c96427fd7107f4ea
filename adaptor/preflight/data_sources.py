"""Every dataset prefix a run will open, gathered the way Megatron gathers them, then checked.

Megatron takes prefixes from ``--data-path``, ``--train/valid/test-data-path``, a
``--data-args-path`` text file (the same words as ``--data-path``) or a
``--per-split-data-args-path`` JSON file (``{"train": ..., "valid": ..., "test": ...}``),
and reads them in ``megatron.training.utils.common_utils.get_blend_and_blend_per_split``
only when it builds the datasets, after the model. The two files are read here first, so
a missing file or malformed JSON is one line instead of a traceback from the builder.
"""
from __future__ import annotations

import json
import os

from adaptor.errors import ArgumentError
from adaptor.preflight.indexed_data import check_prefix


def blend_prefixes(words) -> list[str]:
    """Dataset prefixes of a Megatron blend: ``[w1, p1, w2, p2]`` or ``[p1, p2]``.

    Mirrors ``megatron.core.datasets.utils.get_blend_from_list``: each argument is one
    prefix (stripped, never split on spaces), so a quoted ``"0.5 a 0.5 b"`` is checked as
    the single prefix Megatron would open.
    """
    if not words:
        return []
    words = [str(item).strip() for item in words]

    def is_weight(x):
        try:
            float(x)
            return True
        except ValueError:
            return False

    if len(words) % 2 == 0 and all(is_weight(w) for w in words[0::2]):
        return words[1::2]
    return words


def _read_text(path: str, flag: str) -> str:
    try:
        with open(path) as stream:
            return stream.read()
    except OSError as exc:
        raise ArgumentError(f"{flag} {path}: {exc.strerror or exc}") from None


def sources(args) -> list[tuple[str, list[str]]]:
    """(flag as the user wrote it, blend words) for every data source on the command line."""
    found = []
    for dest in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        words = getattr(args, dest, None)
        if words:
            found.append((f"--{dest.replace('_', '-')}", list(words)))
    path = getattr(args, "data_args_path", None)
    if path:
        flag = "--data-args-path"
        words = _read_text(path, flag).split()
        if not words:
            raise ArgumentError(f"{flag} {path}: the file is empty; it should hold what --data-path would")
        found.append((f"{flag} {path}", words))
    path = getattr(args, "per_split_data_args_path", None)
    if path:
        flag = "--per-split-data-args-path"
        try:
            doc = json.loads(_read_text(path, flag))
        except ValueError as exc:
            raise ArgumentError(f"{flag} {path}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or not {"train", "valid", "test"} <= set(doc):
            raise ArgumentError(f"{flag} {path}: must be a JSON object with keys \"train\", \"valid\" and \"test\"")
        for split in ("train", "valid", "test"):
            value = doc[split]
            words = value.split() if isinstance(value, str) else value
            if words is None:
                continue
            if not isinstance(words, list):
                raise ArgumentError(f"{flag} {path}: \"{split}\" must be a string or a list of weights and prefixes")
            found.append((f"{flag} {path} ({split})", words))
    return found


def check_data_sources(args) -> None:
    """Raise ArgumentError for the first data source that cannot be trained on."""
    if getattr(args, "mock_data", False):
        return
    instruction = getattr(args, "is_instruction_dataset", False)
    for flag, words in sources(args):
        for prefix in blend_prefixes(words):
            if "://" in prefix:
                continue  # object storage: its own client checks it
            if getattr(args, "sft", False):  # Megatron's SFTDataset reads a JSONL file of conversations
                if not os.path.isfile(prefix):
                    raise ArgumentError(f"{flag}: --sft reads JSONL conversation files, and {prefix} is not a file")
                continue
            if instruction:  # tools/preprocess_data.py's instruction handlers: three datasets per prefix
                from adaptor.finetune.instruction_dataset import FIELDS, field_prefix

                if not os.path.isfile(field_prefix(prefix, "input_ids") + ".idx") and os.path.isfile(prefix + ".idx"):
                    raise ArgumentError(f"{flag}: {prefix} is a pretraining dataset, not an instruction dataset "
                                        "(PREFIX_packed_input_ids_document); drop --is-instruction-dataset or "
                                        "preprocess with an instruction --handler-name")
                for name in FIELDS[:2]:
                    check_prefix(field_prefix(prefix, name), flag)
                continue
            if getattr(args, "is_pairwise_dataset", False):  # the pairwise handlers: four datasets per prefix
                from adaptor.finetune.instruction_dataset import field_prefix
                from adaptor.preference.pairwise_dataset import FIELDS as PAIR_FIELDS, is_pairwise_prefix

                if is_pairwise_prefix(prefix):
                    for name in PAIR_FIELDS:
                        check_prefix(field_prefix(prefix, name), flag)
                continue  # not pairwise at all: the preference_training feature says so in one line
            missing = [ext for ext in (".bin", ".idx") if not os.path.isfile(prefix + ext)]
            if missing and len(prefix.split()) > 1:
                raise ArgumentError(
                    f"{flag}: {prefix!r} is one argument, so Megatron reads it as a single dataset prefix, "
                    f"which has no {' or '.join(missing)}; pass weights and prefixes as separate, unquoted arguments"
                )
            check_prefix(prefix, flag)
