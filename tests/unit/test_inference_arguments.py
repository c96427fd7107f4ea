"""inference.py's flags (patches/inference/generation.py): checked before Megatron validates, one sentence each.

The flags are read by inference.py only: given to another entry they are refused, not silently kept.
"""
from __future__ import annotations

import argparse

import pytest

from adaptor.backend import Backend
from adaptor.features import ArgumentError, FeatureContext
from adaptor.inference import ENTRY
from patches.inference.generation import Generation


def ctx(*explicit):
    return FeatureContext(backend=Backend("cpu", "gloo", "test"), flags=argparse.Namespace(), explicit=set(explicit))


def args(**given):
    values = dict(task=None, max_new_tokens=128, max_length=None, add_eos_token=[], use_kv_cache=False,
                  input_file=None, output_file=None, prompt=None, seq_length=64, context_parallel_size=1,
                  sequence_parallel=False)
    values.update(given)
    return argparse.Namespace(**values)


@pytest.fixture
def inference_entry():
    ENTRY["inference"] = True
    yield
    ENTRY["inference"] = False


def test_other_entries_refuse_the_flags():
    with pytest.raises(ArgumentError, match=r"^--max-new-tokens is read by inference.py"):
        Generation().validate(args(max_new_tokens=4), ctx("max_new_tokens"))
    Generation().validate(args(), ctx())  # not given: nothing to say


@pytest.mark.parametrize("given,message", [
    (dict(prompt="hi", task="beam_search"), "--task beam_search is not built yet"),
    (dict(prompt="hi", task="summarise"), "--task summarise is not a task inference.py knows"),
    (dict(), "needs one of --prompt TEXT or --input-file"),
    (dict(prompt="hi", input_file="p.jsonl", output_file="o.jsonl"), "needs one of --prompt TEXT or --input-file"),
    (dict(input_file="p.jsonl"), "--input-file needs --output-file"),
    (dict(prompt="hi", output_file="o.jsonl"), "--output-file is written for --input-file"),
    (dict(prompt="hi", max_new_tokens=0), "--max-new-tokens must be at least 1"),
    (dict(prompt="hi", max_length=65), "--max-length 65 must be between 1 and --seq-length 64"),
    (dict(prompt="hi", context_parallel_size=2), "--context-parallel-size 1"),
])
def test_bad_combinations_are_one_sentence(inference_entry, given, message):
    with pytest.raises(ArgumentError, match=message):
        Generation().validate(args(**given), ctx(*given))


def test_defaults_greedy_and_sequence_parallel_off(inference_entry):
    parsed = args(prompt="hi", sequence_parallel=True)
    Generation().validate(parsed, ctx("prompt", "sequence_parallel"))
    assert parsed.task == "greedy_search" and parsed.sequence_parallel is False
