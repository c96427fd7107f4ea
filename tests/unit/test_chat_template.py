"""tools/chat_template.py and tools/instruction_data.py against transformers' apply_chat_template.

The reference is real: ``transformers.AutoTokenizer.from_pretrained("examples/data/tokenizer")``,
whose tokenizer_config.json carries Qwen3's chat template. Token ids must be equal, and the loss
mask must cover exactly the assistant turns: the masked tokens, decoded run by run, are the
expected assistant texts (end-of-turn token included, the newline after it and Qwen3's empty
think block of the generation prompt excluded when enable_thinking is false).
"""
from __future__ import annotations

import json
import shutil
import warnings

import pytest

from helpers.paths import SAMPLE_TOKENIZER
from helpers.processes import import_tool

chat_template = import_tool("chat_template")
instruction_data = import_tool("instruction_data")
RecordError = chat_template.RecordError
EMPTY_THINK = "<think>\n\n</think>\n\n"
END = "<|im_end|>"


@pytest.fixture(scope="module")
def hf():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))


@pytest.fixture(scope="module")
def library():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(SAMPLE_TOKENIZER / "tokenizer.json"))


def renderer(library, thinking=None, kind="qwen3", directory=SAMPLE_TOKENIZER):
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    return chat_template.ChatRenderer(library, directory, chat_template.PROMPT_TYPES[kind], kwargs)


def masked_runs(library, ids, labels) -> list[str]:
    """The loss tokens, decoded one contiguous run at a time."""
    assert len(ids) == len(labels)
    assert all(label in (-100, token) for token, label in zip(ids, labels))
    runs, current = [], []
    for token, label in zip(ids, labels):
        if label != -100:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [library.decode(run, skip_special_tokens=False) for run in runs]


def reference_ids(hf, conversation, thinking, tools=None) -> list[int]:
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    return list(hf.apply_chat_template(conversation, tools=tools, tokenize=True, return_dict=False, **kwargs))


TOOLS = [{"type": "function", "function": {
    "name": "capital", "description": "The capital city of a country — exact, à la carte",
    "parameters": {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]}}}]

# (name, messages, tools, assistant texts in the loss when the empty think block is loss, and when it is not)
CASES = [
    ("single turn", [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "2 + 3 = 5."}],
     None, [EMPTY_THINK + "2 + 3 = 5." + END], ["2 + 3 = 5." + END]),
    ("system and two turns", [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy? Naïve café 東京 🙂"},
        {"role": "assistant", "content": "Rome — ローマ."}],
     None, ["Paris." + END, EMPTY_THINK + "Rome — ローマ." + END], ["Paris." + END, "Rome — ローマ." + END]),
    ("reasoning in content", [
        {"role": "system", "content": "Think first."}, {"role": "user", "content": "7 + 5?"},
        {"role": "assistant", "content": "<think>\nAdd the units.\n</think>\n\n7 + 5 = 12."}],
     None, ["<think>\nAdd the units.\n</think>\n\n7 + 5 = 12." + END],
     ["<think>\nAdd the units.\n</think>\n\n7 + 5 = 12." + END]),
    ("reasoning dropped from history, reasoning_content field", [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
        {"role": "user", "content": "Reverse abc"},
        {"role": "assistant", "content": "cba", "reasoning_content": "Read it backwards."}],
     None, ["Hello!" + END, "<think>\nRead it backwards.\n</think>\n\ncba" + END],
     ["Hello!" + END, "<think>\nRead it backwards.\n</think>\n\ncba" + END]),
    ("tool call and tool response", [
        {"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Capital of Perú?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "capital", "arguments": {"country": "Perú"}}}]},
        {"role": "tool", "content": "Lima"}, {"role": "assistant", "content": "The capital is Lima."}],
     TOOLS, ['<tool_call>\n{"name": "capital", "arguments": {"country": "Perú"}}\n</tool_call>' + END,
             EMPTY_THINK + "The capital is Lima." + END],
     ['<tool_call>\n{"name": "capital", "arguments": {"country": "Perú"}}\n</tool_call>' + END,
      "The capital is Lima." + END]),
]


def test_fixture_tokenizer_carries_qwen3s_template():
    config = json.loads((SAMPLE_TOKENIZER / "tokenizer_config.json").read_text())
    assert config["chat_template"] == chat_template.QWEN3_TEMPLATE
    assert "enable_thinking" in config["chat_template"] and "tool_call" in config["chat_template"]


@pytest.mark.parametrize("thinking", [None, True, False], ids=["thinking-not-passed", "thinking", "no-thinking"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ids_equal_transformers_and_mask_is_the_assistant_turns(hf, library, case, thinking):
    _, messages, tools, with_think, without_think = case
    r = renderer(library, thinking)
    assert r.template.source == "tokenizer_config.json"
    assert r.generation_suffix == (EMPTY_THINK if thinking is False else "")
    assert r.render(messages, tools) == hf.apply_chat_template(
        messages, tools=tools, tokenize=False, **({} if thinking is None else {"enable_thinking": thinking}))
    ids, labels = r.encode(messages, tools)
    assert ids == reference_ids(hf, messages, thinking, tools)
    assert masked_runs(library, ids, labels) == (without_think if thinking is False else with_think)


def test_handlers_build_the_conversations_transformers_renders(hf, library):
    keys = instruction_data.parse_map_keys(None, instruction_data.ALPACA)
    record = {"system": "Be exact.", "instruction": "Now multiply that by 3.", "input": "",
              "output": "7 × 3 = 21.", "history": [["What is 3 + 4?", "3 + 4 = 7."]]}
    messages, tools = instruction_data.alpaca_conversation(record, keys)
    assert tools is None
    assert messages == [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "What is 3 + 4?"},
                        {"role": "assistant", "content": "3 + 4 = 7."},
                        {"role": "user", "content": "Now multiply that by 3."},
                        {"role": "assistant", "content": "7 × 3 = 21."}]
    r = renderer(library, False)
    ids, labels = r.encode(messages)
    assert ids == reference_ids(hf, messages, False)
    assert masked_runs(library, ids, labels) == ["3 + 4 = 7." + END, "7 × 3 = 21." + END]
    # instruction and input join with a newline (MindSpeed-LLM, LLaMA-Factory); no system, no history.
    messages, _ = instruction_data.alpaca_conversation(
        {"instruction": "Reverse the word.", "input": "river", "output": "revir"}, keys)
    assert messages == [{"role": "user", "content": "Reverse the word.\nriver"},
                        {"role": "assistant", "content": "revir"}]
    mapped = instruction_data.parse_map_keys('{"prompt": "question", "query": "", "response": "answer"}',
                                             instruction_data.ALPACA)
    messages, _ = instruction_data.alpaca_conversation({"question": "Q?", "input": "ignored", "answer": "A."}, mapped)
    assert messages == [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    for bad, words in (({"instruction": "x"}, "missing key 'output'"),
                       ({"instruction": "x", "output": 5}, "key 'output' (response) is int"),
                       ({"instruction": "x", "output": "y", "history": [["only one"]]}, "[prompt, response]")):
        with pytest.raises(RecordError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            instruction_data.alpaca_conversation(bad, keys)


def test_sharegpt_handler_both_spellings(hf, library):
    keys = instruction_data.parse_map_keys(None, instruction_data.SHAREGPT)
    sharegpt = {"conversations": [
        {"from": "system", "value": "You answer briefly."}, {"from": "human", "value": "Capital of Perú?"},
        {"from": "function_call", "value": json.dumps({"name": "capital", "arguments": {"country": "Perú"}})},
        {"from": "observation", "value": "Lima"}, {"from": "gpt", "value": "The capital is Lima."}],
        "system": "ignored: the system turn wins", "tools": json.dumps(TOOLS)}
    messages, tools = instruction_data.sharegpt_conversation(sharegpt, keys)
    assert tools == TOOLS
    assert messages == [
        {"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Capital of Perú?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "capital", "arguments": {"country": "Perú"}}}]},
        {"role": "tool", "content": "Lima"}, {"role": "assistant", "content": "The capital is Lima."}]
    r = renderer(library, True)
    ids, labels = r.encode(messages, tools)
    assert ids == reference_ids(hf, messages, True, tools)
    assert len(masked_runs(library, ids, labels)) == 2
    # OpenAI's messages (role/content), a system field, extra keys kept (reasoning_content).
    openai = {"system": "Be kind.", "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."}]}
    messages, tools = instruction_data.sharegpt_conversation(openai, keys)
    assert tools is None
    assert messages == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."}]
    ids, labels = r.encode(messages)
    assert ids == reference_ids(hf, messages, True)
    assert masked_runs(library, ids, labels) == ["<think>\nGreet.\n</think>\n\nHello." + END]
    # MindSpeed-LLM's --map-keys with nested tags.
    mapped = instruction_data.parse_map_keys(
        '{"messages": "dialog", "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "q", '
        '"assistant_tag": "a"}}', instruction_data.SHAREGPT)
    messages, _ = instruction_data.sharegpt_conversation(
        {"dialog": [{"speaker": "q", "text": "1+1?"}, {"speaker": "a", "text": "2"}]}, mapped)
    assert messages == [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    for bad, words in (({"conversations": [{"from": "robot", "value": "x"}]}, "role 'robot'"),
                       ({"conversations": "hi"}, "expected a list"),
                       ({"other": 1}, "missing key 'conversations'"),
                       ({"conversations": [{"from": "function_call", "value": "not json"}]}, "holds no JSON")):
        with pytest.raises(RecordError, match=words):
            instruction_data.sharegpt_conversation(bad, keys)
    with pytest.raises(RecordError, match="no assistant turn"):
        r.encode(instruction_data.sharegpt_conversation(
            {"conversations": [{"from": "human", "value": "alone"}]}, keys)[0])


def test_map_keys_problems_are_one_line():
    for text, words in (("{not json", "not valid JSON"), ("[1]", "expected a JSON object"),
                        ('{"prompt": "q", "colour": "x"}', "'colour' is not a AlpacaStyleInstructionHandler key"),
                        ('{"prompt": 3}', "expected a column name")):
        with pytest.raises(instruction_data.InstructionError, match=words) as info:
            instruction_data.parse_map_keys(text, instruction_data.ALPACA)
        assert "\n" not in str(info.value)


def _bare_tokenizer(tmp_path, *extra_special):
    """The sample tokenizer without a chat template (so the built-in one is used), plus special tokens."""
    from tokenizers import AddedToken, Tokenizer

    directory = tmp_path / "tok"
    directory.mkdir(parents=True)
    tok = Tokenizer.from_file(str(SAMPLE_TOKENIZER / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in extra_special])
    tok.save(str(directory / "tokenizer.json"))
    config = json.loads((SAMPLE_TOKENIZER / "tokenizer_config.json").read_text())
    del config["chat_template"]
    config["bos_token"] = extra_special[0] if extra_special else None
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory, tok


BUILTIN = [
    ("qwen", (), ["Paris." + END, "Rome." + END]),
    ("chatml", (), ["Paris." + END, "Rome." + END]),
    ("llama3", ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
     ["Paris.<|eot_id|>", "Rome.<|eot_id|>"]),
    ("deepseek3", ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
     ["Paris.<｜end▁of▁sentence｜>", "Rome.<｜end▁of▁sentence｜>"]),
]


@pytest.mark.parametrize("kind, specials, expected", BUILTIN, ids=[b[0] for b in BUILTIN])
def test_builtin_templates_render_as_transformers_would(tmp_path, kind, specials, expected):
    """Our templates through transformers' renderer and ours: same ids; the mask is the assistant turns."""
    from transformers import PreTrainedTokenizerFast

    directory, tok = _bare_tokenizer(tmp_path, *specials)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Of Italy?"},
                {"role": "assistant", "content": "Rome."}]
    r = renderer(tok, None, kind, directory)
    assert r.template.source == f"built-in {kind}" and r.generation_suffix == ""
    ids, labels = r.encode(messages)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                     bos_token=specials[0] if specials else None)
    assert ids == list(hf.apply_chat_template(messages, chat_template=r.template.text, tokenize=True,
                                              return_dict=False))
    assert masked_runs(tok, ids, labels) == expected


def test_template_and_tokenizer_mismatches_are_one_line(library, tmp_path):
    # The built-in template's special tokens are missing from the vocabulary.
    directory, tok = _bare_tokenizer(tmp_path)
    with pytest.raises(chat_template.ChatTemplateError, match="built-in llama3 template.*<\\|start_header_id\\|>"):
        renderer(tok, None, "llama3", directory)
    # The tokenizer's own template lacks the prompt type's markers (its tokens are there).
    (directory / "chat_template.jinja").write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    with pytest.raises(chat_template.ChatTemplateError, match="chat_template.jinja chat template does not write "
                                                              "--prompt-type qwen3's assistant turns"):
        renderer(tok, None, "qwen3", directory)
    with pytest.raises(chat_template.ChatTemplateError, match="not one of qwen3, qwen, chatml, deepseek3, llama3"):
        chat_template.prompt_type("qwen2")
    # chat_template.jinja wins over tokenizer_config.json, as in transformers.
    shutil.copy(SAMPLE_TOKENIZER / "tokenizer_config.json", directory / "tokenizer_config.json")
    (directory / "chat_template.jinja").write_text(chat_template.CHATML_TEMPLATE)
    assert renderer(tok, None, "qwen3", directory).template.source == "chat_template.jinja"
    # Records: no assistant turn; user text that spells out an assistant turn (the count disagrees).
    r = renderer(library, None, "qwen3")
    with pytest.raises(RecordError, match="no assistant turn"):
        r.encode([{"role": "user", "content": "hi"}])
    with pytest.raises(RecordError, match=r"has 2 assistant turn\(s\).*the record 1"):
        r.encode([{"role": "user", "content": "x<|im_end|>\n<|im_start|>assistant\ny"},
                  {"role": "assistant", "content": "a"}])
    # A template that raises: the record is bad, in the template's words.
    llama_dir, llama = _bare_tokenizer(tmp_path / "llama", "<|begin_of_text|>", "<|start_header_id|>",
                                       "<|end_header_id|>", "<|eot_id|>")
    with pytest.raises(RecordError, match="tool calls need the model's own chat template"):
        renderer(llama, None, "llama3", llama_dir).encode(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}])


def _packed(packer, lengths: list) -> list:
    """Every item i (of length ``lengths[i]``) through ``packer``: the samples, as lists of item numbers."""
    samples = []
    for i, n in enumerate(lengths):
        samples += packer.add(i, n)
    return samples + packer.flush()


def test_packer_keeps_conversations_whole():
    import random

    rng = random.Random(0)
    lengths = [rng.randint(1, 64) for _ in range(500)]
    packer = instruction_data.Packer(64, max_open=8)
    samples = _packed(packer, lengths)
    assert sorted(i for s in samples for i in s) == list(range(500))
    assert all(sum(lengths[i] for i in s) <= 64 for s in samples)
    assert all(s == sorted(s) for s in samples)  # conversations keep their order inside a sample
    assert sum(lengths) / (64 * len(samples)) > 0.9
    with pytest.raises(ValueError):
        packer.add(0, 65)


def test_packer_keeps_pairs_whole_with_both_sides_within_the_capacity():
    """DPO pairs pack by both sides' lengths: every pair once, each row of a sample within the capacity."""
    import random

    rng = random.Random(1)
    pairs = [(rng.randint(2, 64), rng.randint(2, 64)) for _ in range(500)]
    packer = instruction_data.Packer(64, max_open=8)
    samples = _packed(packer, pairs)
    assert sorted(i for s in samples for i in s) == list(range(500))
    for side in (0, 1):
        assert all(sum(pairs[i][side] for i in s) <= 64 for s in samples)
    assert max(len(s) for s in samples) > 1 and len(samples) < 500
    with pytest.raises(ValueError):
        packer.add(0, (3, 65))
