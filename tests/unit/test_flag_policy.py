"""Every flag of Megatron's parser is honoured, refused in one line, or said to be not applied.

The walk covers megatron-core's whole parser, so a release that adds a flag fails here until the
flag has a policy in adaptor/command_line/flag_table.py. For each refused or not-applied flag a non-default value
is made from the parser's own type and choices, parsed by Megatron's parser, and judged as a run
on the CPU backend would judge it. Honoured flags must at least be read by some code.
"""
from __future__ import annotations

import argparse
import os
import re
import textwrap
from pathlib import Path

import pytest

from adaptor.command_line.flag_policy import Honoured, NotApplied, Refused, judge, parser_defaults, requirement_checker
from adaptor.command_line.flag_table import MEGATRON_FLAGS
from helpers import processes
from helpers.paths import ROOT
from helpers.processes import import_tool

pytestmark = pytest.mark.usefixtures("cpu_training_process")  # Megatron parses with the features, as in a run


def megatron_parser() -> argparse.ArgumentParser:
    from megatron.training.arguments import add_megatron_arguments

    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False))


def test_every_megatron_flag_has_one_policy():
    dests = {a.dest for a in megatron_parser()._actions if a.option_strings} - {"help"}
    missing = sorted(dests - set(MEGATRON_FLAGS))
    stale = sorted(set(MEGATRON_FLAGS) - dests - {"help"})
    assert not missing, f"flags of megatron-core with no policy in adaptor/command_line/flag_table.py: {missing}"
    assert not stale, f"policies for flags megatron-core no longer has: {stale}"
    assert all(isinstance(p, (Honoured, Refused, NotApplied)) for p in MEGATRON_FLAGS.values())


def _sources() -> str:
    import megatron.training

    megatron_dir = Path(megatron.training.__file__).parents[1]
    files = [f for f in megatron_dir.rglob("*.py") if f.name != "arguments.py"]
    files += list((ROOT / "adaptor").rglob("*.py")) + list((ROOT / "patches").rglob("*.py"))
    files += [ROOT / "pretrain_gpt.py", ROOT / "pretrain_mm.py"]
    return "\n".join(f.read_text(errors="replace") for f in files)


def test_honoured_flags_are_read_by_code():
    """Honoured means some code reads the value: args.<dest>, getattr(args, '<dest>'), or a config field."""
    text = _sources()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    unread = sorted(d for d, p in MEGATRON_FLAGS.items() if isinstance(p, Honoured) and d != "help" and d not in words)
    assert not unread, f"honoured, but nothing outside the parser reads them: {unread}"


# values tried in turn, then a few multi-value lists (module names for the recompute / CUDA-graph lists)
_CANDIDATES = ["2", "1", "3", "0.5", "x", "[1,0]", "1,1", "local", "layernorm", "attn", "mlp", "moe_router"]


def non_default_argv(parser, dest, policy) -> list[str] | None:
    """A command line that gives ``dest`` a value other than its default (and one the policy covers)."""
    action = next(a for a in parser._actions if a.dest == dest and a.option_strings)
    flag = max(action.option_strings, key=lambda s: s.startswith("--"))
    defaults = parser_defaults(parser)
    wants = getattr(policy, "values", None)
    if action.nargs == 0:
        candidates = [[flag]]
    elif action.choices:
        candidates = [[flag, str(getattr(c, "name", c))] for c in action.choices]  # enums parse by name
    else:
        candidates = [[flag, c] for c in _CANDIDATES] + [[flag, "a", "b"], [flag, "2", "2", "8"]]
    for argv in candidates:
        try:
            ns, rest = parser.parse_known_args(argv)
        except (argparse.ArgumentError, SystemExit, ValueError, TypeError, KeyError):
            continue
        value = getattr(ns, dest)
        if rest or (value == defaults[dest] and wants is None):
            continue
        if wants is not None and not wants(value):
            continue
        return argv
    return None


def test_every_refused_or_not_applied_flag_is_one_line_on_cpu():
    parser = megatron_parser()
    available = requirement_checker("cpu")
    unmade, silent = [], []
    for dest, policy in MEGATRON_FLAGS.items():
        if isinstance(policy, Honoured):
            continue
        argv = non_default_argv(parser, dest, policy)
        if argv is None:
            unmade.append(dest)
            continue
        args, _ = parser.parse_known_args(argv)
        verdict = judge(args, parser, MEGATRON_FLAGS, {dest}, "cpu")
        flag = argv[0]
        if isinstance(policy, Refused) and policy.applies(getattr(args, dest), available):
            ok = len(verdict.refused) == 1 and verdict.refused[0].startswith(f"{flag}: ") and "\n" not in verdict.refused[0]
        else:  # not applied on CPU (Refused whose requirement CPU lacks are refused above)
            ok = [d for d, _ in verdict.not_applied] == [dest] and flag in verdict.not_applied[0][1]
        if not ok:
            silent.append((dest, argv, verdict))
    assert not unmade, f"no non-default value could be made for: {unmade}"
    assert not silent, f"neither refused nor said: {silent[:5]}"


def test_requirements_lift_refusals_only_where_met():
    policy = Refused("x", requires=("transformer_engine",))
    assert policy.applies(True, requirement_checker("cpu"))
    assert policy.applies(True, requirement_checker("npu"))
    assert not policy.applies(True, lambda name: True)
    with pytest.raises(ValueError):
        requirement_checker("cpu")("flux_capacitor")


def test_a_default_value_given_explicitly_is_not_refused():
    parser = megatron_parser()
    args, _ = parser.parse_known_args(["--context-parallel-size", "1"])
    assert judge(args, parser, MEGATRON_FLAGS, {"context_parallel_size"}, "cpu").refused == []


def test_flag_reference_pages_are_current():
    """docs/ and the parser snapshot are generated: a table, a feature or megatron-core changed without
    regenerating fails here, the snapshot compared with Megatron's live parser."""
    gen_docs = import_tool("gen_docs")

    assert gen_docs.main(["--parser", "--check"]) == 0, "run python tools/gen_docs.py --parser"


def test_flag_pages_are_written_without_torch():
    """The environment and flag pages come from tables and the committed parser snapshot: a fresh
    interpreter writes them without importing torch or Megatron, as the tool runs."""
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, "tools")
        import gen_docs
        for build in gen_docs.TABLE_PAGES.values():
            build()
        print("FACTS " + json.dumps(sorted(m for m in ("torch", "megatron") if m in sys.modules)))
    """)
    proc = processes.run_child(code, env=dict(os.environ), timeout=120, warm=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert processes.tagged_json(proc.stdout) == [], "a table page imported torch or Megatron"
