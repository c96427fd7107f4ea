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
                  sequence_parallel=False, stream=False, temperature=1.0, top_k=0, top_p=1.0, num_beams=4,
                  hf_chat_template=False)
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
    (dict(prompt="hi", task="greedy_search", top_p=0.5), "--top-p is read by the sampling tasks"),
    (dict(prompt="hi", top_k=5), "--top-k is read by the sampling tasks"),
    (dict(prompt="hi", task="beam_search", temperature=0.5), "--temperature is read by the sampling tasks"),
    (dict(prompt="hi", task="greedy_search_with_sampling", num_beams=2), "--num-beams is read by the beam tasks"),
    (dict(prompt="hi", task="greedy_search_with_sampling", temperature=0.0), "--temperature must be above 0"),
    (dict(prompt="hi", task="greedy_search_with_sampling", top_p=0.0), r"--top-p must be in \(0, 1\]"),
    (dict(prompt="hi", task="beam_search_with_sampling", top_k=-1), "--top-k must be 0"),
    (dict(prompt="hi", task="beam_search", num_beams=0), "--num-beams must be at least 1"),
    (dict(prompt="hi", task="beam_search", stream=True), "--stream prints one --prompt"),
    (dict(input_file="p.jsonl", output_file="o.jsonl", stream=True), "--stream prints one --prompt"),
    (dict(prompt="hi", task="summarise"), "--task summarise is not a task inference.py knows"),
    (dict(input_file="p.jsonl", output_file="o.jsonl", task=["greedy_search", "beam_search"]),
     "--input-file prompts go through one --task, not 2"),
    (dict(prompt="hi", task=["greedy_search", "chat"], num_beams=2), "--num-beams is read by the beam tasks"),
    (dict(prompt="hi", task=["beam_search"], stream=True), "--stream prints one --prompt"),
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


def test_every_task_with_its_own_flags_passes(inference_entry):
    for task, extra in (("greedy_search", {}), ("greedy_search_with_sampling", dict(top_k=5, top_p=0.9, temperature=0.7)),
                        ("do_sample", dict(top_k=5)), ("return_output_log_probs", dict(temperature=0.7)),
                        ("beam_search", dict(num_beams=3)),
                        ("beam_search_with_sampling", dict(num_beams=2, top_k=4)), ("chat", {})):
        parsed = args(prompt="hi", task=task, **extra)
        Generation().validate(parsed, ctx("prompt", "task", *extra))
        assert parsed.task == [task]
    parsed = args(prompt="hi", task=["greedy", "beam_search_with_sampling"], top_k=4)  # greedy: MindSpeed-LLM's older name
    Generation().validate(parsed, ctx("prompt", "task", "top_k"))
    assert parsed.task == ["greedy_search", "beam_search_with_sampling"]


def test_chat_samples_when_a_sampling_flag_is_given(inference_entry):
    """MindSpeed-LLM's chat scripts pass --top-p and --temperature: chat then samples; without them, greedy."""
    parsed = args(task="chat", top_p=0.9, temperature=0.6, hf_chat_template=True)
    Generation().validate(parsed, ctx("task", "top_p", "temperature", "hf_chat_template"))
    assert parsed.chat_samples
    parsed = args(task="chat")
    Generation().validate(parsed, ctx("task"))
    assert not parsed.chat_samples


def test_other_entries_refuse_hf_chat_template():
    with pytest.raises(ArgumentError, match=r"^--hf-chat-template is read by inference.py and evaluation.py"):
        Generation().validate(args(hf_chat_template=True), ctx("hf_chat_template"))


def test_without_prompt_tasks_run_as_mindspeed_llm_runs_them(inference_entry):
    """No prompt: a task generates for MindSpeed-LLM's demonstration prompt (chat talks on the terminal);
    no --task either, as MindSpeed-LLM's generation scripts run it: every task in its order, chat last."""
    parsed = args(task="chat")
    Generation().validate(parsed, ctx("task"))
    assert parsed.task == ["chat"]
    parsed = args()
    Generation().validate(parsed, ctx())
    assert parsed.task == ["greedy_search", "do_sample", "beam_search", "beam_search_with_sampling",
                           "return_output_log_probs", "chat"]


def test_defaults_greedy_and_sequence_parallel_off(inference_entry):
    parsed = args(prompt="hi", sequence_parallel=True)
    Generation().validate(parsed, ctx("prompt", "sequence_parallel"))
    assert parsed.task == ["greedy_search"] and parsed.sequence_parallel is False
