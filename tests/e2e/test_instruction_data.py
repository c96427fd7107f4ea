"""tools/preprocess_data.py's instruction datasets: MindSpeed-LLM's handlers and names, read back by megatron-core.

Real files, the real command line and megatron-core's ``IndexedDataset`` reading the three outputs
(``PREFIX_packed_{input_ids,labels,attention_mask}_document``). The expected ids come from
transformers' ``apply_chat_template`` on the example tokenizer (Qwen3's chat template), so the
tool, run as a user runs it, is checked against the reference end to end.

Starting a tool process costs ~7 s (torch and Megatron load to build the tokenizer), so the module
fixture starts the runs at once: the successful JSONL run and one bad record through the command
line, the rest through ``preprocess_data.main(argv)`` in ONE helper process (the same code minus
the interpreter start). Mistakes that need no tokenizer fail before those imports: real command
lines, each well under a second or two.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from helpers.paths import SAMPLE_TOKENIZER, TOOLS
from helpers.processes import tool_command

ERROR = "preprocess_data.py: error: "
TIMEOUT = 300
FIELDS = ("input_ids", "labels", "attention_mask")
TOKENIZER = ["--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", str(SAMPLE_TOKENIZER)]
END = "<|im_end|>"


def env() -> dict:
    e = dict(os.environ, ADAPTOR_BACKEND="cpu", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    e.pop("TOKENIZERS_PARALLELISM", None)
    return e


def alpaca_records() -> list[dict]:
    records = []
    for i in range(40):
        record = {"instruction": f"What is {i} + {i + 3}?", "input": "", "output": f"{i} + {i + 3} = {2 * i + 3}."}
        if i % 4 == 1:
            record = {"instruction": "Reverse the word.", "input": f"café{i}", "output": f"café{i}"[::-1]}
        if i % 5 == 2:
            record["system"] = "Answer exactly — précis."
        if i % 6 == 3:
            record["history"] = [[f"Say {i}.", f"{i}."], ["And again?", f"{i} again."]]
        records.append(record)
    return records


def alpaca_messages(record: dict) -> list[dict]:
    messages = [{"role": "system", "content": record["system"]}] if record.get("system") else []
    for question, answer in record.get("history", []):
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    user = "\n".join(p for p in (record["instruction"], record["input"]) if p)
    return messages + [{"role": "user", "content": user}, {"role": "assistant", "content": record["output"]}]


def sharegpt_records() -> list[dict]:
    records = []
    for i in range(30):
        turns = [{"from": "human", "value": f"Count to {i % 7 + 1}."},
                 {"from": "gpt", "value": " ".join(str(n) for n in range(1, i % 7 + 2))}]
        if i % 3 == 0:
            turns += [{"from": "human", "value": "Backwards?"},
                      {"from": "gpt", "value": " ".join(str(n) for n in range(i % 7 + 1, 0, -1))}]
        if i % 10 == 7:  # far longer than the packing length: skipped and counted
            turns[1]["value"] = " ".join(["long"] * 200)
        record = {"conversations": turns}
        if i % 4 == 1:
            record = {"system": "Be brief.", "messages": [
                {"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]} for t in turns]}
        records.append(record)
    return records


def parquet_records() -> list[dict]:
    """ShareGPT records of one shape (a parquet table has one schema): a list of {from, value} structs."""
    return [r for r in sharegpt_records()[:12] if "conversations" in r]


def sharegpt_messages(record: dict) -> list[dict]:
    if "messages" in record:
        return [{"role": "system", "content": record["system"]}, *record["messages"]]
    return [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]}
            for t in record["conversations"]]


def write_jsonl(path: Path, records) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write((record if isinstance(record, str) else json.dumps(record, ensure_ascii=False)) + "\n")
    return path


def reference(messages_list, thinking) -> list[list[int]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    return [list(hf.apply_chat_template(m, tokenize=True, return_dict=False, **kwargs)) for m in messages_list]


def read(prefix: Path) -> dict:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    out = {}
    for field in FIELDS:
        ds = IndexedDataset(f"{prefix}_packed_{field}_document")
        out[field] = [ds[i].tolist() for i in range(len(ds))]
        assert ds.index.dtype == np.int32, (field, ds.index.dtype)
    assert [len(x) for x in out["input_ids"]] == [len(x) for x in out["labels"]] == \
        [len(x) for x in out["attention_mask"]]
    for ids, labels in zip(out["input_ids"], out["labels"]):
        assert all(label in (-100, token) for token, label in zip(ids, labels))
    return out


def decode_runs(ids, labels) -> list[str]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(SAMPLE_TOKENIZER / "tokenizer.json"))
    runs, current = [], []
    for token, label in zip(ids + [0], labels + [-100]):
        if label != -100:
            current.append(token)
        elif current:
            runs.append(tok.decode(current, skip_special_tokens=False))
            current = []
    return runs


class Launched:
    """A command started now, waited on later (output to files, not pipes)."""

    def __init__(self, cmd, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.out, self.err = directory / "stdout.txt", directory / "stderr.txt"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(cmd, env=env(), stdout=out, stderr=err, cwd=directory,
                                         start_new_session=True)
        self._result = None

    def result(self) -> dict:
        if self._result is None:
            try:
                rc = self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                raise
            self._result = {"rc": rc, "stdout": self.out.read_text(), "stderr": self.err.read_text()}
        return self._result


DRIVER = r"""
import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import preprocess_data
results = {}
for name, argv in json.load(open(sys.argv[2])):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = preprocess_data.main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    results[name] = {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}
    json.dump(results, open(sys.argv[3], "w"))
"""


def assert_ok(result: dict) -> str:
    assert result["rc"] == 0, result["stdout"][-3000:] + result["stderr"][-3000:]
    assert "Traceback" not in result["stderr"] and ERROR not in result["stderr"]
    lines = [line for line in result["stdout"].splitlines() if "] done: " in line]
    assert len(lines) == 1, result["stdout"][-2000:]
    return lines[0]


def assert_one_line_error(result: dict, *needles: str) -> str:
    assert result["rc"] not in (0, None), result["stdout"][-2000:]
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    errors = [line for line in lines if ERROR in line]
    assert len(errors) == 1 and lines[-1] == errors[0] and errors[0].startswith(ERROR), result["stderr"][-3000:]
    assert "Traceback" not in result["stderr"]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("instructions")
    data = base / "data"
    data.mkdir()
    alpaca = write_jsonl(data / "alpaca.jsonl", alpaca_records())
    sharegpt = write_jsonl(data / "sharegpt.jsonl", sharegpt_records())
    # A JSON array file, with one conversation that has no assistant turn (skipped with --skip-bad-lines).
    array = sharegpt_records()[:6] + [{"conversations": [{"from": "human", "value": "No answer here."}]}]
    (data / "array.json").write_text(json.dumps(array, ensure_ascii=False, indent=1), encoding="utf-8")
    no_assistant = write_jsonl(data / "no_assistant.jsonl", [
        {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
        {"conversations": [{"from": "human", "value": "only a question"}]}])
    bare = base / "bare_tokenizer"  # the sample tokenizer without its chat template: built-in templates
    bare.mkdir()
    shutil.copy(SAMPLE_TOKENIZER / "tokenizer.json", bare)
    config = json.loads((SAMPLE_TOKENIZER / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    foreign = base / "foreign_template"  # a template without Qwen3's turn markers
    shutil.copytree(bare, foreign)
    (foreign / "chat_template.jinja").write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")

    def out(name: str) -> Path:
        (base / "out" / name).mkdir(parents=True)
        return base / "out" / name / "data"

    cases: dict = {"base": base, "data": data}
    common = ["--handler-name", "AlpacaStyleInstructionHandler", "--prompt-type", "qwen3"]
    cli = {
        "alpaca": Launched(tool_command(
            "preprocess_data.py", "--input", alpaca, "--output-prefix", out("alpaca"), *common,
            "--enable-thinking", "false", "--workers", "2", "--batch-size", "16", "--overwrite-cache", *TOKENIZER),
            base / "logs" / "alpaca"),
        "no_assistant": Launched(tool_command(
            "preprocess_data.py", "--input", no_assistant, "--output-prefix", out("no_assistant"),
            "--handler-name", "SharegptStyleInstructionHandler", "--prompt-type", "qwen3", *TOKENIZER),
            base / "logs" / "no_assistant"),
    }
    sharegpt_args = ["--handler-name", "SharegptStyleInstructionHandler", "--prompt-type", "qwen3", *TOKENIZER]
    jobs = [
        ("unpacked", ["--input", sharegpt, "--output-prefix", out("unpacked"), *sharegpt_args]),
        ("packed", ["--input", sharegpt, "--output-prefix", out("packed"), "--pack", "--seq-length", "128",
                    "--batch-size", "7", *sharegpt_args]),
        ("neat", ["--input", sharegpt, "--output-prefix", out("neat"), "--neat-pack", "--seq-length", "128",
                  "--batch-size", "7", *sharegpt_args]),
        ("array", ["--input", data / "array.json", "--output-prefix", out("array"), "--skip-bad-lines",
                   *sharegpt_args]),
        ("builtin_qwen", ["--input", alpaca, "--output-prefix", out("builtin_qwen"), "--handler-name",
                          "AlpacaStyleInstructionHandler", "--prompt-type", "qwen", "--tokenizer-type",
                          "PretrainedFromHF", "--tokenizer-name-or-path", bare]),
        ("missing_tokens", ["--input", alpaca, "--output-prefix", out("missing_tokens"), "--handler-name",
                            "AlpacaStyleInstructionHandler", "--prompt-type", "llama3", "--tokenizer-type",
                            "PretrainedFromHF", "--tokenizer-name-or-path", bare]),
        ("foreign_template", ["--input", alpaca, "--output-prefix", out("foreign_template"), "--handler-name",
                              "AlpacaStyleInstructionHandler", "--prompt-type", "qwen3", "--tokenizer-type",
                              "PretrainedFromHF", "--tokenizer-name-or-path", foreign]),
    ]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        cases["parquet"] = False
    else:
        cases["parquet"] = True
        pq.write_table(pa.Table.from_pylist(parquet_records()), data / "rows.parquet")  # nested columns
        jobs.append(("parquet", ["--input", data / "rows.parquet", "--output-prefix", out("parquet"),
                                 *sharegpt_args]))
    jobs_file, results_file = base / "jobs.json", base / "results.json"
    jobs_file.write_text(json.dumps([(name, [str(a) for a in argv]) for name, argv in jobs]))
    driver = Launched([sys.executable, "-c", DRIVER, str(TOOLS), str(jobs_file), str(results_file)],
                      base / "logs" / "driver")
    cases["cli"] = cli

    def helper(name: str) -> dict:
        outcome = driver.result()
        assert outcome["rc"] == 0, outcome["stderr"][-3000:]
        return json.loads(results_file.read_text())[name]

    cases["helper"] = helper
    yield cases
    for launched in [*cli.values(), driver]:
        if launched.proc.poll() is None:
            os.killpg(launched.proc.pid, signal.SIGKILL)


def test_alpaca_jsonl_round_trip_equals_transformers(runs):
    result = runs["cli"]["alpaca"].result()
    line = assert_ok(result)
    assert "40 conversations, 40 samples" in line and "0 bad records skipped" in line
    assert "--overwrite-cache is not applied" in result["stderr"]  # accepted, one note
    prefix = runs["base"] / "out" / "alpaca" / "data"
    got = read(prefix)
    records = alpaca_records()
    messages = [alpaca_messages(r) for r in records]
    assert got["input_ids"] == reference(messages, False)
    assert all(set(mask) == {1} for mask in got["attention_mask"])  # one conversation per sample
    for record, ids, labels in zip(records, got["input_ids"], got["labels"]):
        answers = [a for _, a in record.get("history", [])] + [record["output"]]
        assert decode_runs(ids, labels) == [a + END for a in answers]  # no think block: enable_thinking false
    meta = json.loads((runs["base"] / "out" / "alpaca" / "data_packed_meta.json").read_text())
    assert meta["handler"] == "AlpacaStyleInstructionHandler" and meta["prompt_type"] == "qwen3"
    assert meta["template_source"] == "tokenizer_config.json" and len(meta["template_sha256"]) == 64
    assert meta["enable_thinking"] is False and meta["pack"] is False and meta["seq_length"] is None
    assert meta["counts"]["conversations"] == 40 and meta["counts"]["samples"] == 40
    assert meta["counts"]["loss_tokens"] == sum(sum(1 for x in labels if x != -100) for labels in got["labels"])
    assert sorted(os.listdir(prefix.parent)) == sorted(
        [f"data_packed_{f}_document{ext}" for f in FIELDS for ext in (".bin", ".idx")] + ["data_packed_meta.json"])


def test_sharegpt_both_spellings_unpacked(runs):
    line = assert_ok(runs["helper"]("unpacked"))
    assert "30 conversations, 30 samples" in line
    got = read(runs["base"] / "out" / "unpacked" / "data")
    assert got["input_ids"] == reference([sharegpt_messages(r) for r in sharegpt_records()], None)


@pytest.mark.parametrize("name", ["packed", "neat"])
def test_pack_keeps_conversations_whole(runs, name):
    line = assert_ok(runs["helper"](name))
    unpacked = read(runs["base"] / "out" / "unpacked" / "data")
    packed = read(runs["base"] / "out" / name / "data")
    fits = [(ids, labels) for ids, labels in zip(unpacked["input_ids"], unpacked["labels"]) if len(ids) <= 128]
    too_long = len(unpacked["input_ids"]) - len(fits)
    assert too_long >= 3 and f"{len(fits)} conversations" in line and f"{too_long} longer than --seq-length" in line
    pieces = []
    for ids, labels, mask in zip(packed["input_ids"], packed["labels"], packed["attention_mask"]):
        assert 0 < len(ids) <= 128
        assert mask[0] == 1 and all(b - a in (0, 1) for a, b in zip(mask, mask[1:]))  # 1, 1, ..., 2, 2, ..., k
        for k in range(1, mask[-1] + 1):
            at = [i for i, m in enumerate(mask) if m == k]
            pieces.append(([ids[i] for i in at], [labels[i] for i in at]))
    assert len(packed["input_ids"]) < len(fits)  # packing did something
    assert sorted(pieces) == sorted(fits)  # every conversation exactly once, never split
    meta = json.loads((runs["base"] / "out" / name / "data_packed_meta.json").read_text())
    assert meta["pack"] is True and meta["seq_length"] == 128 and meta["counts"]["too_long_skipped"] == too_long


def test_json_array_and_skipped_bad_record(runs):
    result = runs["helper"]("array")
    line = assert_ok(result)
    assert "6 conversations" in line and "1 bad records skipped" in line
    assert "array.json: element 7: the conversation has no assistant turn" in result["stderr"]
    got = read(runs["base"] / "out" / "array" / "data")
    assert got["input_ids"] == reference([sharegpt_messages(r) for r in sharegpt_records()[:6]], None)


def test_builtin_template_when_the_tokenizer_has_none(runs):
    result = runs["helper"]("builtin_qwen")
    assert_ok(result)
    assert "chat template built-in qwen" in result["stdout"]
    got = read(runs["base"] / "out" / "builtin_qwen" / "data")
    first = decode_runs(got["input_ids"][0], got["input_ids"][0])[0]  # every token: the whole sample
    assert first.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")  # Qwen2.5's default
    assert decode_runs(got["input_ids"][0], got["labels"][0]) == [alpaca_records()[0]["output"] + END]


def test_parquet_round_trip(runs):
    if not runs["parquet"]:
        pytest.skip("pyarrow is not installed (pip install pyarrow)")
    assert_ok(runs["helper"]("parquet"))
    got = read(runs["base"] / "out" / "parquet" / "data")
    assert got["input_ids"] == reference([sharegpt_messages(r) for r in parquet_records()], None)


@pytest.mark.parametrize("name, needles", [
    ("no_assistant", ["no_assistant.jsonl:2: the conversation has no assistant turn", "--skip-bad-lines"]),
    ("missing_tokens", ["--prompt-type llama3 (built-in llama3 template) needs the special token(s) "
                        "<|start_header_id|>, <|end_header_id|>, <|eot_id|>"]),
    ("foreign_template", ["chat_template.jinja chat template does not write --prompt-type qwen3's assistant turns"]),
])
def test_bad_input_needing_the_tokenizer_is_one_line(runs, name, needles):
    result = runs["cli"][name].result() if name in runs["cli"] else runs["helper"](name)
    assert_one_line_error(result, *needles)
    assert os.listdir(runs["base"] / "out" / name) == []


@pytest.mark.parametrize("args, needle", [
    (["--handler-name", "R1AlpacaStyleInstructionHandler", "--prompt-type", "qwen3"],
     "--handler-name R1AlpacaStyleInstructionHandler (MindSpeed-LLM): not built by this tool"),
    (["--handler-name", "AlpacaStylePairwiseHandler", "--prompt-type", "qwen3", "--neat-pack"],
     "--neat-pack needs --seq-length N"),
    (["--handler-name", "AlpacaStyleInstructionHandler", "--prompt-type", "qwen2"],
     "--prompt-type qwen2: not one of qwen3, qwen, chatml, deepseek3, llama3"),
    (["--handler-name", "AlpacaStyleInstructionHandler", "--prompt-type", "qwen3", "--map-keys", "{prompt: x"],
     "--map-keys '{prompt: x': not valid JSON"),
    (["--handler-name", "AlpacaStyleInstructionHandler", "--prompt-type", "qwen3", "--pack"],
     "--pack needs --seq-length N"),
    (["--prompt-type", "qwen3"], "--prompt-type applies to instruction datasets: add --handler-name"),
])
def test_cheap_mistakes_fail_fast_in_one_line(runs, tmp_path, args, needle):
    start = time.perf_counter()
    proc = subprocess.run(tool_command("preprocess_data.py", "--input", runs["data"] / "alpaca.jsonl",
                                       "--output-prefix", tmp_path / "data", *args, *TOKENIZER),
                          env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert_one_line_error({"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}, needle)
    assert time.perf_counter() - start < 6  # before torch and Megatron load
    assert os.listdir(tmp_path) == []
