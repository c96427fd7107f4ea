"""A training command line checked before torch and Megatron are imported: its errors in a second, not ten.

Otherwise a misspelt flag or missing dataset is answered after seven to ten seconds of imports, with
argparse's 770-line usage. ``import adaptor`` calls :func:`check` for the entry files; it parses with
Megatron's parser rebuilt from its snapshot (:mod:`adaptor.command_line.parser_snapshot`) and reports
in one line, as the run would: argparse errors (with the likely spelling), MindSpeed-LLM rewrite
refusals, flags refused on every backend (:mod:`adaptor.command_line.flag_table`), and the preflight
checks (:mod:`adaptor.preflight`) unless arguments also come from ``--use-checkpoint-args``,
``--yaml-cfg`` or name instruction datasets. Anything needing the backend or Megatron is left to
argument validation; an accepted command line is parsed again by Megatron.
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import sys
from pathlib import Path

from adaptor import env
from adaptor.errors import ArgumentError, fail

ROOT = Path(__file__).resolve().parents[2]
ENTRY_FILES = ("pretrain_gpt.py", "posttrain_gpt.py", "pretrain_mm.py")


# The flags Megatron-LM's own pretrain_gpt.py adds when nvidia-modelopt is installed
# (megatron/post_training/arguments.py at core_r0.19.0): that package is not in the megatron-core wheel.
MODELOPT_FLAGS = frozenset(
    "--enable-gpt-oss --export-default-te-spec --export-force-local-attention --export-kd-cfg "
    "--export-kd-teacher-ckpt-format --export-kd-teacher-load --export-kd-teacher-model-config "
    "--export-kv-cache-quant --export-legacy-megatron --export-model-type --export-moe-apply-probs-on-input "
    "--export-offline-model --export-qk-l2-norm --export-quant-cfg --export-real-quant-cfg "
    "--export-te-mcore-model --finetune-data-split --finetune-hf-dataset --freeze-base-for-mtp "
    "--modelopt-enabled --qad-train-target".split())


def one_line(message: str, options) -> str:
    """argparse's ``message`` with the nearest known spelling of each unknown flag; Megatron-LM's ModelOpt
    flags are named for what they are."""
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return message
    modelopt = [t for t in message[len(prefix):].split() if t.split("=", 1)[0] in MODELOPT_FLAGS]
    if modelopt:
        return (f"{modelopt[0].split('=', 1)[0]}: a NVIDIA ModelOpt flag (distillation, quantization and their "
                "exports), which Megatron-LM's pretrain_gpt.py adds from its megatron.post_training package when "
                "nvidia-modelopt is installed; neither ships with megatron-core, so ModelOpt runs are not "
                "supported here: drop the --export-* and ModelOpt flags")
    hints = []
    for token in message[len(prefix):].split():
        flag = token.split("=", 1)[0]
        if flag.startswith("--"):
            close = difflib.get_close_matches(flag, list(options), n=1, cutoff=0.8)
            if close:
                hints.append(f"{flag}: did you mean {close[0]}?")
    return message + ("; " + "; ".join(hints) if hints else "")


def errors_in_one_line(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` report a bad command line as one line and exit 2, without the usage text."""

    def error(message):
        fail(one_line(message, [opt for a in parser._actions for opt in a.option_strings]))

    parser.error = error
    return parser


def is_entry_file(program: str) -> bool:
    path = Path(program)
    return path.name in ENTRY_FILES and path.resolve().parent == ROOT


def _refusal(args, parser, exact: set[str], argv: list[str]) -> str | None:
    from adaptor.command_line.flag_policy import Refused, explicit_dests, judge
    from adaptor.command_line.flag_table import MEGATRON_FLAGS

    def missing_everywhere(requirement: str) -> bool:  # "cuda" depends on the backend: decided later
        return requirement != "cuda" and importlib.util.find_spec(requirement) is None

    table = {dest: p for dest, p in MEGATRON_FLAGS.items() if isinstance(p, Refused) and dest in exact
             and (not p.requires or any(missing_everywhere(r) for r in p.requires))}
    verdict = judge(args, parser, table, explicit_dests(parser, argv), backend="cpu")
    return verdict.refused[0] if verdict.refused else None


def check(argv: list[str]) -> None:
    """Exit with one line when ``argv`` (without the program) has an error found without torch."""
    from adaptor.command_line import parser_snapshot
    from adaptor.command_line.mindspeed_llm import rewrite_pretrain_argv

    if any(a in ("-h", "--help") for a in argv):
        return  # Megatron's own help, with the help texts
    rows = parser_snapshot.load()
    if rows is None:
        return
    rewrite = rewrite_pretrain_argv(list(argv))
    if rewrite.refused:
        fail(rewrite.refused[0])
    parser, exact = parser_snapshot.rebuild(rows, prog=Path(sys.argv[0]).name)
    args = errors_in_one_line(parser).parse_args(rewrite.argv)
    line = _refusal(args, parser, exact, rewrite.argv)
    if line:
        fail(line)
    if args.use_checkpoint_args or getattr(args, "yaml_cfg", None) or args.is_instruction_dataset:
        return  # arguments from elsewhere too, or instruction datasets: the run checks them in order
    from adaptor.preflight.checkpoint_dirs import check_load_inputs
    from adaptor.preflight.data_sources import check_data_sources
    from adaptor.preflight.output_dirs import check_output_dirs
    from adaptor.preflight.parallel_layout import check_parallel_layout

    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))  # as Megatron's parse_args sets it
    try:  # the order of the features (argument_checks, then patches/preflight): the first error is the run's
        check_parallel_layout(args)
        check_data_sources(args)
        check_load_inputs(args)
        check_output_dirs(args)
    except ArgumentError as exc:
        fail(str(exc))


def check_entry_command_line() -> None:
    """:func:`check` for ``sys.argv`` when the program is one of our entry files, unless switched off."""
    if env.is_on("ADAPTOR_EARLY_CHECK") and sys.argv and is_entry_file(sys.argv[0]):
        check(sys.argv[1:])
