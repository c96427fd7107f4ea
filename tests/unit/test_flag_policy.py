"""Every flag of Megatron's parser is honoured, refused in one line, or said to be not applied.

The walk covers megatron-core's whole parser, so a release that adds a flag fails here until the
flag has a policy in adaptor/command_line/flag_table.py. For each refused or not-applied flag a non-default value
is made from the parser's own type and choices, parsed by Megatron's parser, and judged as a run
on the CPU backend would judge it. Honoured flags must at least be read by some code: loads found
in the syntax trees of Megatron's package and ours, never a name in a table, string or comment.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import pydoc
import textwrap
import warnings
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


ENTRY_FILES = ("pretrain_gpt.py", "posttrain_gpt.py", "pretrain_mm.py", "inference.py", "evaluation.py")

# Megatron builds these dataclasses from ``args`` by field name (a loop over ``dataclasses.fields`` that
# copies ``getattr(args, f.name)``), in these functions of its training path; a dest that is a field of
# one reaches code as ``<config>.<dest>``.
BY_NAME_COPIES = {
    "megatron.training.argument_utils.core_transformer_config_from_args": (
        "megatron.core.transformer.transformer_config.TransformerConfig",
        "megatron.core.transformer.transformer_config.MLATransformerConfig"),
    "megatron.training.training.get_megatron_optimizer_config": ("megatron.core.optimizer.OptimizerConfig",),
    "megatron.training.training.get_megatron_ddp_config": ("megatron.core.distributed.DistributedDataParallelConfig",),
    "megatron.training.training.train": ("megatron.training.config.FaultInjectorConfig",),
}

# Honoured although no code reads the value, because it asks for what always happens.
ALWAYS_SO = {"deprecated_use_mcore_models": "megatron-core models are the only kind Megatron and pretrain_gpt.py build"}


def _code_files() -> list[Path]:
    """Megatron's whole package (arguments.py and megatron.core included) and the project's run-time code."""
    import megatron.training

    files = sorted(Path(megatron.training.__file__).parents[1].rglob("*.py"))
    files += sorted((ROOT / "adaptor").rglob("*.py")) + sorted((ROOT / "patches").rglob("*.py"))
    return files + [ROOT / name for name in ENTRY_FILES]


def _is_args(node: ast.AST) -> bool:
    """``args``, ``self.args``, ``megatron_args``, ``get_args()``: the names Megatron and we give the namespace."""
    if isinstance(node, ast.Name):
        return node.id.endswith("args")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("args")
    if isinstance(node, ast.Call):
        func = node.func
        return getattr(func, "id", getattr(func, "attr", None)) == "get_args"
    return False


def _literal_getattr(node: ast.AST) -> tuple[ast.AST, str] | None:
    """``getattr(obj, "name"[, default])`` as (obj, name)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[0], node.args[1].value
    return None


def code_reads(trees) -> tuple[set[str], set[str]]:
    """(names read from the argument namespace, names read as an attribute of anything).

    Only loads count: ``args.x = ...`` and ``del args.x`` write; strings, comments and docstrings
    (a table that spells a flag's name, a help text) are not code that reads it."""
    from_args, anywhere = set(), set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                anywhere.add(node.attr)
                if _is_args(node.value):
                    from_args.add(node.attr)
            elif (found := _literal_getattr(node)) is not None:
                anywhere.add(found[1])
                if _is_args(found[0]):
                    from_args.add(found[1])
    return from_args, anywhere


def _copies_by_name(function) -> bool:
    """The function has ``for f in fields(...)`` with ``getattr(<args>, f.name)`` inside."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
        iterated = loop.iter
        if not (isinstance(iterated, ast.Call) and getattr(iterated.func, "id", getattr(iterated.func, "attr", "")) == "fields"):
            continue
        for node in ast.walk(loop):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and len(node.args) >= 2
                    and _is_args(node.args[0]) and isinstance(node.args[1], ast.Attribute) and node.args[1].attr == "name"):
                return True
    return False


def _by_name_fields() -> set[str]:
    fields = set()
    for function_path, classes in BY_NAME_COPIES.items():
        function = pydoc.locate(function_path)
        assert function is not None and _copies_by_name(function), (
            f"{function_path} no longer copies args into {classes} by field name: update BY_NAME_COPIES")
        for class_path in classes:
            fields |= {f.name for f in dataclasses.fields(pydoc.locate(class_path))}
    return fields


def test_honoured_flags_are_read_by_code():
    """Honoured means some code reads the value, found in the syntax trees of Megatron's package and
    of adaptor/, patches/ and the entry files:

    * ``<args>.<dest>`` or ``getattr(<args>, "<dest>")``, the namespace under the names Megatron and
      we give it (see ``_is_args``); or
    * for a dest that Megatron copies by name into TransformerConfig, OptimizerConfig,
      DistributedDataParallelConfig or FaultInjectorConfig (BY_NAME_COPIES, checked to still copy),
      ``<anything>.<dest>``: the field is read from the config under whatever name it travels
      (``config``, ``self.config``, ``ddp_config``...). That is weaker than following the object,
      and says only that the field has a reader, not which one.

    A dest that no code reads is either mistaken for honoured (it must be refused, or noted when it
    only tunes speed or memory) or dropped by a bug."""
    with warnings.catch_warnings():  # invalid escapes in some of Megatron's docstrings
        warnings.simplefilter("ignore", SyntaxWarning)
        trees = [ast.parse(f.read_text(), str(f)) for f in _code_files()]
    from_args, anywhere = code_reads(trees)
    copied = _by_name_fields()
    read = from_args | (copied & anywhere)
    honoured = {d for d, p in MEGATRON_FLAGS.items() if isinstance(p, Honoured) and d != "help"}
    unread = sorted(honoured - read - set(ALWAYS_SO))
    assert not unread, f"honoured, but no code reads them: {unread}"
    assert not set(ALWAYS_SO) & read, "a flag ALWAYS_SO exempts is read after all: drop it from ALWAYS_SO"
    assert set(ALWAYS_SO) <= honoured


def test_the_reading_check_sees_only_code():
    """A name in a string, a comment or a docstring, or an assignment to the namespace, is no read;
    a load through any of the namespace's names is."""
    tree = ast.parse(textwrap.dedent('''
        """args.in_docstring"""
        TABLE = {"in_table": 1}  # args.in_comment
        args.written = 1
        del args.deleted
        x = args.plain + self.args.on_self + get_args().from_call + getattr(megatron_args, "through_getattr", 0)
        y = config.on_config
    '''))
    from_args, anywhere = code_reads([tree])
    assert from_args == {"plain", "on_self", "from_call", "through_getattr"}
    assert anywhere == from_args | {"args", "on_config"}


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
