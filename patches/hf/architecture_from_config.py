"""The model's architecture from a Hugging Face config.json, so the weights' own description is the command line's.

No upstream function is changed: the command line is completed before anything reads it. When the
run starts from a Hugging Face directory (``--hf-load-dir DIR``) or from a checkpoint
``tools/convert_ckpt.py`` wrote (``--load DIR`` holding ``hf/conversion.json`` and ``hf/config.json``),
every architecture flag the command line does not give is appended with the value
:func:`adaptor.convert.megatron_args_from_hf_config` derives from config.json (layers, widths, heads and
query groups, norms, RoPE and its scaling, MoE routing, MLA, MTP, the vocabulary). Appending to the
command line, rather than setting parsed values, lets every later reader see the same model: the
features that turn on from model flags, Megatron's parser and its checks. One line at start lists
what was taken. A flag given explicitly is kept, and must still agree with config.json: the checks of
``--hf-load-dir`` (``patches.hf.online_conversion``) and of a converted ``--load``
(``patches.checkpoint.load_shape_check``) name the first flag that does not.

Not taken: the training choices (sequence length, parallel sizes, precision, the tokenizer).
``--max-position-embeddings`` is config.json's unless ``--seq-length`` is longer, when it is the
sequence length (Megatron requires it to cover the sequence; with RoPE it only sizes the position table).
"""
from __future__ import annotations

import json
from pathlib import Path

from adaptor.features import Feature

# Flags megatron_args_from_hf_config gives that are training choices, not the architecture.
NOT_TAKEN = {"padded_vocab_size", "seq_length", "tokenizer_type", "tokenizer_model"}
CONVERSION_RECORD = Path("hf") / "conversion.json"


def _value_of(argv: list[str], flag: str) -> str | None:
    """The last value ``flag`` has in ``argv`` (``--flag V`` or ``--flag=V``), or None."""
    found = None
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif token.startswith(flag + "="):
            found = token[len(flag) + 1:]
    return found


def architecture_source(argv: list[str]) -> tuple[str, dict, str | None] | None:
    """(where, config.json, model type) of the Hugging Face description this command line starts from."""
    hf_dir, load = _value_of(argv, "--hf-load-dir"), _value_of(argv, "--load")
    if _value_of(argv, "--mm-model"):
        return None  # model.json describes a multimodal run's model (its --hf-load-dir is refused there)
    if hf_dir:
        path, where, model_type = Path(hf_dir) / "config.json", f"--hf-load-dir {hf_dir}", _value_of(argv, "--model-type-hf")
    elif load and (Path(load) / CONVERSION_RECORD).is_file():
        path, where = Path(load) / "hf" / "config.json", f"--load {load}"
        try:
            model_type = json.loads((Path(load) / CONVERSION_RECORD).read_text())["model_type"]
        except (OSError, ValueError, KeyError, TypeError):
            return None  # the shape checks of --load report an unreadable record
    else:
        return None
    try:
        return where, json.loads(path.read_text()), model_type
    except (OSError, ValueError):
        return None  # --hf-load-dir's own checks say what is wrong with the directory


def _given_dests(argv: list[str]) -> set[str]:
    """The Megatron dests ``argv`` names, by option string only: its values are Megatron's parser's to
    judge later (``--ckpt-format safetensors`` is a choice our features add, say)."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(add_help=False, allow_abbrev=False))
    tokens = {token.split("=", 1)[0] for token in argv if token.startswith("--")}
    return {action.dest for action in parser._actions if tokens & set(action.option_strings)}


def _flag_groups(flags: list[str]) -> list[tuple[str, list[str]]]:
    """``["--a", "1", "--b"]`` -> ``[("--a", ["1"]), ("--b", [])]``."""
    groups: list[tuple[str, list[str]]] = []
    for token in flags:
        if token.startswith("--"):
            groups.append((token, []))
        else:
            groups[-1][1].append(token)
    return groups


def architecture_flags(argv: list[str]) -> tuple[str, list[str], list[str]] | None:
    """(where, the flags to append, how each is described at start) for ``argv``; None when no
    Hugging Face description applies. An unsupported config.json is one line naming it."""
    from adaptor.convert import ConversionError
    from adaptor.convert.config_check import hf_model_type, megatron_namespace, model_flags
    from adaptor.errors import fail
    from adaptor.features import ArgumentError

    source = architecture_source(argv)
    if source is None:
        return None
    where, config, model_type = source
    try:
        model_type = hf_model_type(config, model_type, where)
        flags = model_flags(model_type, config)
    except ArgumentError as exc:
        fail(str(exc))
    except ConversionError as exc:
        fail(f"{where}: {exc}")
    given = _given_dests(argv)
    _, _, options = megatron_namespace(flags)
    dest_of = {flag: dest for dest, flag in options.items()}
    added: list[str] = []
    described: list[str] = []
    for flag, values in _flag_groups(flags):
        dest = dest_of.get(flag)
        if dest is None or dest in NOT_TAKEN or dest in given:
            continue
        shown = values
        seq_length = _value_of(argv, "--seq-length")
        if dest == "max_position_embeddings" and seq_length and seq_length.isdigit() and int(seq_length) > int(values[0]):
            values = [seq_length]
            shown = [f"{seq_length} (--seq-length; config.json has {flags[flags.index(flag) + 1]})"]
        added += [flag, *values]
        described.append(" ".join([flag, *shown]))
    return where, added, described


class ArchitectureFromConfig(Feature):
    name = "architecture_from_config"

    def __init__(self) -> None:
        self.note: str | None = None

    def rewrite_argv(self, argv: list[str]) -> list[str]:
        found = architecture_flags(argv)
        if not found or not found[1]:
            self.note = None
            return argv
        where, added, described = found
        self.note = f"{where}: architecture from its config.json: {' '.join(described)}"
        return argv + added

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and self.note is not None

    def set_defaults(self, args, ctx) -> None:
        from adaptor.log import notice_once

        notice_once(self.note)  # Megatron may parse the arguments twice
