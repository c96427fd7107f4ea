"""A bad command line is answered before torch is imported, with the line the run itself would print.

Each case runs twice: as a user's ``python pretrain_gpt.py`` (cold, under ``-X importtime``, so the
imports are on record: torch must not be among them), and with ``ADAPTOR_EARLY_CHECK=0``, where the
same command line reaches Megatron's own parser and argument validation. Both must end with exit
status 2 and the same single error line.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers.megatron_runs import TINY_QWEN3, TINY_QWEN3_MODEL, side_by_side
from helpers.one_line_errors import SCRIPT, assert_one_line_error, base_env, run_python

CASES = {
    "misspelt flag": (["--lr-decay-stile", "cosine"], "--lr-decay-stile: did you mean --lr-decay-style?"),
    "value not among the choices": (["--lr-decay-style", "cosin"], "invalid choice: 'cosin'"),
    "flag without its value": (["--num-layers"], "argument --num-layers: expected one argument"),
    "not a number": (["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
    "refused on every backend": (["--hybrid-context-parallel"], "--hybrid-context-parallel:"),
    "refused without Transformer Engine": (["--fp8-format", "hybrid"], "--fp8-format:"),
}
# without --mock-data: the run reads this dataset
NO_DATA = (TINY_QWEN3_MODEL + ["--tokenizer-type", "NullTokenizer", "--vocab-size", "512",
                               "--data-path", "/nonexistent/corpus_text_document"],
           "--data-path: dataset '/nonexistent/corpus_text_document' has no")
COMMAND_LINES = {**{name: (TINY_QWEN3 + bad, text) for name, (bad, text) in CASES.items()},
                 "dataset that is not there": NO_DATA,
                 "--save is a file": (TINY_QWEN3 + ["--save", "{inputs}/a_file"], "--save {inputs}/a_file: is a regular file"),
                 "--load tracker holds garbage": (TINY_QWEN3 + ["--load", "{inputs}/ckpt"], "holds 'garbage', not an iteration")}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "a_file").write_text("not a directory")
    (folder / "ckpt").mkdir()
    (folder / "ckpt" / "latest_checkpointed_iteration.txt").write_text("garbage")
    return folder


def command_line(case, inputs) -> tuple[list[str], str]:
    argv, text = COMMAND_LINES[case]
    return [a.format(inputs=inputs) for a in argv], text.format(inputs=inputs)
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def late_lines(tmp_path_factory, inputs):
    """Each case's error line from Megatron's parser and validation (the early check switched off)."""
    cwd = tmp_path_factory.mktemp("late")
    cases = {name: command_line(name, inputs) for name in COMMAND_LINES}
    runs = side_by_side(*[(lambda argv=argv: run_python(argv, cwd, ADAPTOR_EARLY_CHECK="0"))
                          for argv, _ in cases.values()])
    return {name: assert_one_line_error(run, [text], torchrun=False)
            for (name, (_, text)), run in zip(cases.items(), runs)}


@pytest.mark.parametrize("case", list(COMMAND_LINES))
def test_answered_before_torch_with_the_runs_own_line(case, late_lines, inputs, tmp_path):
    argv, text = command_line(case, inputs)
    proc = subprocess.run([sys.executable, "-X", "importtime", SCRIPT, *argv], cwd=tmp_path,
                          env=base_env(), capture_output=True, text=True, timeout=120)
    imported = set(IMPORTED.findall(proc.stderr))
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    line = assert_one_line_error(proc, [text], torchrun=False)
    assert "adaptor.command_line.early_check" in imported, "the early check did not run"
    assert "torch" not in imported and "megatron" not in imported, "the error came after the heavy imports"
    assert line == late_lines[case]
    assert list(tmp_path.iterdir()) == []
