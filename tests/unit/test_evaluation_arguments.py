"""evaluation.py's flags (patches/inference/evaluation.py) and the --task it shares with inference.py.

One argparse definition of --task serves both entries; each checks its own values, and any other
entry refuses the flags in one sentence.
"""
from __future__ import annotations

import argparse

import pytest

from adaptor.backend import Backend
from adaptor.features import ArgumentError, FeatureContext
from adaptor.inference import ENTRY
from patches.inference.evaluation import Evaluation
from patches.inference.generation import Generation


def ctx(*explicit):
    return FeatureContext(backend=Backend("cpu", "gloo", "test"), flags=argparse.Namespace(), explicit=set(explicit))


def args(**given):
    values = dict(task=None, task_data_path=None, include_path=None, num_fewshot=0, limit=None,
                  eval_output_file=None, max_new_tokens=128, max_length=None, add_eos_token=[], use_kv_cache=False,
                  input_file=None, output_file=None, prompt=None, seq_length=64, context_parallel_size=1,
                  sequence_parallel=False, stream=False, temperature=1.0, top_k=0, top_p=1.0, num_beams=4)
    values.update(given)
    return argparse.Namespace(**values)


@pytest.fixture
def evaluation_entry():
    ENTRY["evaluation"] = True
    yield
    ENTRY["evaluation"] = False


def test_other_entries_refuse_the_flags():
    with pytest.raises(ArgumentError, match=r"^--num-fewshot is read by evaluation.py"):
        Evaluation().validate(args(num_fewshot=5), ctx("num_fewshot"))
    with pytest.raises(ArgumentError, match=r"^--task is read by inference.py and evaluation.py"):
        Generation().validate(args(task=["sample_mc"]), ctx("task"))
    Evaluation().validate(args(), ctx())


def test_evaluation_takes_task_names_and_generation_leaves_them(evaluation_entry):
    parsed = args(task=["sample_mc", "mmlu"], sequence_parallel=True)
    Generation().validate(parsed, ctx("task"))
    Evaluation().validate(parsed, ctx("task", "sequence_parallel"))
    assert parsed.task == ["sample_mc", "mmlu"] and parsed.sequence_parallel is False
    with pytest.raises(ArgumentError, match=r"^--max-new-tokens is read by inference.py"):
        Generation().validate(args(task=["x"], max_new_tokens=4), ctx("task", "max_new_tokens"))


@pytest.mark.parametrize("given,message", [
    (dict(), "evaluation.py needs --task"),
    (dict(task=["x"], num_fewshot=-1), "--num-fewshot must be 0 or more"),
    (dict(task=["x"], limit=0), "--limit must be at least 1"),
    (dict(task=["x"], context_parallel_size=2), "--context-parallel-size 1"),
])
def test_bad_values_are_one_sentence(evaluation_entry, given, message):
    with pytest.raises(ArgumentError, match=message):
        Evaluation().validate(args(**given), ctx(*given))


def test_inference_runs_its_tasks_in_order():
    ENTRY["inference"] = True
    try:
        parsed = args(task=["greedy_search", "chat"], prompt="hi")
        Generation().validate(parsed, ctx("task", "prompt"))
        assert parsed.task == ["greedy_search", "chat"]
        with pytest.raises(ArgumentError, match="--task mmlu is not a task inference.py knows"):
            Generation().validate(args(task=["mmlu"], prompt="hi"), ctx("task", "prompt"))
    finally:
        ENTRY["inference"] = False
