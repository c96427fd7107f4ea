"""The command line checked before torch is imported reads it as Megatron's own parser does.

The snapshot of the parser (adaptor/command_line/megatron_parser.json) is compared with the live one
by ``tools/gen_docs.py --parser --check`` (test_flag_policy.py). Here: a command line that sets every flag
at once parses to the same values with the rebuilt parser as with Megatron's; the early refusals
are exactly the refusals the run would make for the flags it decides; an unknown flag gets the
nearest spelling.
"""
from __future__ import annotations

import argparse

import pytest


from adaptor import bootstrap
from adaptor.command_line import early_check, parser_snapshot
from adaptor.command_line.flag_policy import Refused, judge
from adaptor.command_line.flag_table import MEGATRON_FLAGS


@pytest.fixture(scope="module")
def parsers():
    from megatron.training.arguments import add_megatron_arguments

    live = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False))
    live = bootstrap.all_features().add_arguments(live)
    rebuilt, exact = parser_snapshot.rebuild(parser_snapshot.snapshot(live), prog="pretrain_gpt.py")
    return live, rebuilt, exact


def given(action) -> list[str] | None:
    """A command-line fragment that sets ``action`` to a value other than its default."""
    flag = action.option_strings[-1]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [f"--no-{flag[2:]}" if action.default else flag]
    if action.nargs == 0:
        return [flag]
    if action.choices is not None:
        value = [str(c) for c in action.choices if c != action.default]
        value = value[-1:] if value else None
    elif action.type is int:
        value = ["3"]
    elif action.type is float:
        value = ["0.25"]
    elif action.type in (None, str):
        value = ["x"]
    else:
        return None  # Megatron's own converters: the snapshot keeps the string and leaves the value to Megatron
    if value is None:
        return None
    if action.nargs in ("+", "*"):
        value = value * 2
    elif isinstance(action.nargs, int):
        value = value * action.nargs
    return [flag, *value]


def test_every_flag_parses_to_megatrons_value(parsers):
    live, rebuilt, exact = parsers
    counts: dict[str, int] = {}
    for a in live._actions:
        counts[a.dest] = counts.get(a.dest, 0) + 1
    argv, dests = [], []
    for action in live._actions:
        if action.option_strings and counts[action.dest] == 1 and action.dest in exact:
            fragment = given(action)
            if fragment:
                argv += fragment
                dests.append(action.dest)
    assert len(dests) > 700, "the command line should set nearly every flag"
    ours, megatron = rebuilt.parse_args(argv), live.parse_args(argv)
    differ = [(d, getattr(ours, d), getattr(megatron, d)) for d in dests if getattr(ours, d) != getattr(megatron, d)]
    assert not differ, differ[:10]
    defaults = [(d, getattr(rebuilt.parse_args([]), d), getattr(live.parse_args([]), d))
                for d in exact if getattr(rebuilt.parse_args([]), d, None) != getattr(live.parse_args([]), d, None)]
    assert not defaults, defaults[:10]


def test_early_refusals_are_the_runs_refusals(parsers, monkeypatch):
    live, rebuilt, exact = parsers
    checked = 0
    for dest, policy in MEGATRON_FLAGS.items():
        if not isinstance(policy, Refused) or policy.requires or dest not in exact:
            continue
        action = next(a for a in live._actions if a.dest == dest)
        fragment = given(action)
        if fragment is None:
            continue
        late = judge(live.parse_args(fragment), live, MEGATRON_FLAGS, {dest}, backend="cpu").refused
        early = early_check._refusal(rebuilt.parse_args(fragment), rebuilt, exact, fragment)
        assert early == (late[0] if late else None), (dest, early, late)
        checked += bool(late)
    assert checked > 20, "the refused flags should be decided early"


def test_unknown_flag_gets_the_nearest_spelling():
    options = ["--lr-decay-style", "--lr", "--num-layers"]
    line = early_check.one_line("unrecognized arguments: --lr-decay-stile cosine --bogus", options)
    assert line == ("unrecognized arguments: --lr-decay-stile cosine --bogus; "
                    "--lr-decay-stile: did you mean --lr-decay-style?")
    assert early_check.one_line("argument --lr: expected one argument", options) == "argument --lr: expected one argument"


def test_modelopt_flags_are_named_for_what_they_are():
    """Megatron-LM's ModelOpt flags (its megatron/post_training, not in the wheel): one line naming the first."""
    line = early_check.one_line("unrecognized arguments: --export-te-mcore-model --export-kd-cfg a.yaml", ["--lr"])
    assert line.startswith("--export-te-mcore-model: a NVIDIA ModelOpt flag"), line
    assert "not supported here" in line and "\n" not in line


def test_only_the_entry_files_are_checked(tmp_path):
    assert early_check.is_entry_file(str(early_check.ROOT / "pretrain_gpt.py"))
    assert early_check.is_entry_file(str(early_check.ROOT / "posttrain_gpt.py"))
    assert not early_check.is_entry_file(str(tmp_path / "pretrain_gpt.py"))  # a user's own script of that name
    assert not early_check.is_entry_file(str(early_check.ROOT / "tools" / "convert_ckpt.py"))


def test_megatrons_deprecated_no_op_flag_passes(monkeypatch):
    """--ckpt-fully-parallel-save: Megatron accepts it with a deprecation line; its own functional tests pass it."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
            "--max-position-embeddings", "64", "--micro-batch-size", "1", "--global-batch-size", "2",
            "--train-iters", "1", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512",
            "--ckpt-format", "torch_dist"]
    early_check.check(argv)
    early_check.check(argv + ["--ckpt-fully-parallel-save"])  # exits with its one line if refused
    assert not isinstance(MEGATRON_FLAGS["ckpt_fully_parallel_save_deprecated"], Refused)
