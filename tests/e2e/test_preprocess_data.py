"""tools/preprocess_data.py: raw text in, Megatron indexed datasets out, tokenized as training tokenizes.

Everything is real: tokenizers trained or built here with the ``tokenizers``
library, files on disk, megatron-core's own ``IndexedDataset`` reading the
output and its ``IndexedDatasetBuilder`` writing the reference bytes.

Each fresh process of the tool spends ~7 s importing torch and Megatron (it
imports ``adaptor`` to build the tokenizer the way training does), so the
module fixture starts every command at once and the tests wait on theirs:

* the bad-input cases, the JSONL round trip and the interrupted run go through
  the real command line, one subprocess each;
* the other successful runs (workers 2, globs, directories, parquet, ...) run
  ``preprocess_data.main(argv)`` one after another inside ONE helper
  subprocess that imports the tool once — the same code path minus the
  interpreter start, kept out of the pytest process because ``import
  adaptor`` patches Megatron.
"""
from __future__ import annotations

import gzip
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.datasets import write_indexed_dataset
from helpers.paths import TOOLS
from helpers.processes import import_tool, tool_command

TOOL = TOOLS / "preprocess_data.py"
ERROR = "preprocess_data.py: error: "
TIMEOUT = 300
EOT = "<|endoftext|>"

indexed_writer = import_tool("indexed_writer")
IndexedDatasetWriter, remove_stale_temps = indexed_writer.IndexedDatasetWriter, indexed_writer.remove_stale_temps

WORDS = ("the a river town baker harbour morning lantern quiet bright seven orchard ferry copper "
         "wind bread market bridge slowly carried found walked under over beside and but because "
         "she he they it was were is are green small old new cold warm").split()
TRICKY = [
    "naïve café — 東京 🙂 and bytes the tokenizer never saw",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\n\ninside one document",
    f"a document{EOT}with the end token spelled out",
    " ",  # one space: byte-level BPE gives it a token, so it is a document
    "x",
]


def sentences(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        out.append(" ".join(words).capitalize() + rng.choice([".", ".", "!", "?"]))
    return " ".join(out)


def make_docs(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [sentences(rng, rng.randint(1, 4)) for _ in range(n)]


def env() -> dict:
    e = dict(os.environ, ADAPTOR_BACKEND="cpu", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    e.pop("TOKENIZERS_PARALLELISM", None)
    return e


def tool(*args) -> list[str]:
    return tool_command("preprocess_data.py", *args)


def snapshot(directory: Path) -> dict:
    """Every file under ``directory`` (hidden ones too) and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# Tokenizers ----------------------------------------------------------------------------------

def train_bpe(directory: Path) -> Path:
    """A small byte-level BPE with <|endoftext|>, saved the way a Hub tokenizer directory is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(make_docs(1, 400) + TRICKY, trainer)
    directory.mkdir(parents=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOT}))
    return directory


def big_vocab(directory: Path) -> Path:
    """70 000 whole-word tokens (ids past uint16) and no special tokens at all (so no eod)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    while len(vocab) < 70000:
        vocab[f"w{len(vocab)}"] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def encode(tokenizer_dir: Path, texts, eod: int | None = None) -> list[list[int]]:
    """The reference: the tokenizers library's own ids (no Megatron), empty documents dropped."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    out = []
    for text in texts:
        ids = tok.encode(text).ids
        if ids:
            out.append(ids + ([eod] if eod is not None else []))
    return out


def read_dataset(prefix) -> tuple[list[list[int]], type]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))
    docs = [ds[i].tolist() for i in range(len(ds))]
    assert ds.document_indices.tolist() == list(range(len(ds) + 1))
    return docs, ds.index.dtype


def old_pair(prefix: Path) -> None:
    """A dataset already at the prefix, which no failed run may touch."""
    write_indexed_dataset(prefix, ([5, 6, 7], [8, 9]), np.uint16)


# Running the tool ----------------------------------------------------------------------------

class Launched:
    """A command started now, waited on later (output goes to files, not pipes)."""

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
        except SystemExit as exc:  # argparse (--help, usage errors)
            rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    results[name] = {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}
    json.dump(results, open(sys.argv[3], "w"))
"""


def assert_ok(result: dict) -> None:
    assert result["rc"] == 0, result["stdout"][-3000:] + result["stderr"][-3000:]
    assert "Traceback" not in result["stderr"]
    assert "huggingface/tokenizers" not in result["stdout"] + result["stderr"]  # fork warning


def assert_one_line_error(result: dict, *needles: str) -> str:
    assert result["rc"] not in (0, None), result["stdout"][-2000:]
    lines = result["stderr"].strip().splitlines()
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith(ERROR), result["stderr"][-3000:]
    assert [line for line in lines if ERROR in line] == [last]
    assert "Traceback" not in result["stderr"]
    for needle in needles:
        assert needle in last, last
    return last


def summary(result: dict) -> str:
    lines = [line for line in result["stdout"].splitlines() if "] done: " in line]
    assert len(lines) == 1, result["stdout"][-2000:]
    return lines[0]


# The fixture: inputs for every case, all commands started at once ---------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("preprocess")
    bpe, big = train_bpe(base / "bpe"), big_vocab(base / "big")
    common = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model"]
    cases: dict = {"base": base, "bpe": bpe, "big": big, "expect": {}}
    cli: dict = {}
    jobs: list = []

    # JSONL with two keys, appended eod: command line (workers 1) and helper (workers 2).
    data = base / "jsonl"
    data.mkdir()
    texts, titles = make_docs(2, 300) + TRICKY + [""], [f"Title {i}" for i in range(307)]
    titles[5] = ""  # an empty title is skipped in the title dataset only
    with open(data / "docs.jsonl", "w", encoding="utf-8") as f:
        for i, (text, title) in enumerate(zip(texts, titles)):
            f.write(json.dumps({"id": i, "title": title, "text": text}, ensure_ascii=i % 2 == 0) + "\n")
        f.write("\n")  # a trailing blank line is not a document
    cases["expect"]["jsonl"] = {"text": encode(bpe, texts, eod=0), "title": encode(bpe, titles, eod=0)}
    for workers in (1, 2):
        argv = ["--input", data / "docs.jsonl", "--output-prefix", base / f"w{workers}" / "out",
                "--json-keys", "text", "title", "--append-eod", "--workers", workers,
                "--batch-size", 64, "--log-interval", 100, *common, bpe]
        (base / f"w{workers}").mkdir()
        if workers == 2:  # forked workers from a real command line: no warnings, same bytes
            cli["jsonl_w2"] = Launched(tool(*argv), base / "logs" / "jsonl_w2")
        else:
            jobs.append(("jsonl_w1", argv))

    # Plain text, one document per line, through a glob; a stale temp file from a dead run.
    txt = base / "txt"
    txt.mkdir()
    (txt / "a.txt").write_text("first line\n\nthird line after an empty one\nlast line no newline")
    (txt / "b.txt").write_bytes("windows line\r\n  spaced  \r\nnaïve 🙂\n".encode())
    (txt / "c.md").write_text("not matched by the glob\n")
    line_docs = ["first line", "", "third line after an empty one", "last line no newline",
                 "windows line", "  spaced  ", "naïve 🙂"]
    cases["expect"]["glob"] = encode(bpe, line_docs)
    (base / "glob").mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = IndexedDatasetWriter(str(base / "glob" / "out_text_document"), np.uint16,
                                 tag=f"{socket.gethostname()}.{dead.pid}")
    stale.add_document([1, 2, 3])
    stale._bin.close()
    stale._lengths.close()  # left as a killed run leaves them
    cases["stale"] = [stale.tmp_bin, stale.tmp_lengths]
    jobs.append(("glob", ["--input", str(txt / "*.txt"), "--output-prefix", base / "glob" / "out",
                          "--log-interval", 0, *common, bpe]))

    # A directory, one document per file, mixed formats, big vocabulary -> int32 by itself.
    docs = base / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("a whole file\nof two lines\n")
    (docs / "b.jsonl").write_text(json.dumps({"text": "river w69999 town"}) + "\n" +
                                  json.dumps({"text": "w65600 bridge"}) + "\n")
    (docs / "c.txt.gz").write_bytes(gzip.compress(b"compressed baker harbour"))
    (docs / "sub" / "z.txt").write_text("nested market w70000")
    (docs / ".hidden.txt").write_text("hidden files are skipped")
    (docs / "notes.md").write_text("not a data extension inside a directory")
    cases["expect"]["dir"] = encode(big, ["a whole file\nof two lines\n", "river w69999 town", "w65600 bridge",
                                          "compressed baker harbour", "nested market w70000"])
    (base / "dir").mkdir()
    jobs.append(("dir", ["--input", docs, "--text-document-per", "file", "--output-prefix",
                         base / "dir" / "out", *common, big]))

    # --dtype int32 forced, with every kind of bad line skipped.
    mixed = base / "mixed.jsonl"
    good = make_docs(3, 6)
    lines = [json.dumps({"text": good[0]}).encode(), b'{"text": "unterminated',
             json.dumps({"text": good[1]}).encode(), b'{"title": "no text key"}',
             json.dumps({"text": good[2]}).encode(), b'{"text": "caf\xe9 latin-1"}',
             b'{"text": 5}', b'{"text": ""}', b'[1, 2]',
             json.dumps({"text": good[3]}).encode(), json.dumps({"text": good[4]}).encode()]
    mixed.write_bytes(b"\n".join(lines) + b"\n")
    cases["expect"]["int32"] = encode(bpe, good[:5], eod=0)
    (base / "int32").mkdir()
    jobs.append(("int32", ["--input", mixed, "--output-prefix", base / "int32" / "out", "--dtype", "int32",
                           "--skip-bad-lines", "--append-eod", "--workers", 2, *common, bpe]))

    # Parquet, two columns, when pyarrow is installed.
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        cases["parquet"] = False
    else:
        cases["parquet"] = True
        ptexts, ptitles = make_docs(4, 250), [f"T{i}" for i in range(250)]
        pq.write_table(pa.table({"text": ptexts, "title": ptitles, "n": list(range(250))}),
                       base / "rows.parquet", row_group_size=100)
        cases["expect"]["parquet"] = {"text": encode(bpe, ptexts), "title": encode(bpe, ptitles)}
        (base / "parquet").mkdir()
        jobs.append(("parquet", ["--input", base / "rows.parquet", "--json-keys", "text", "title",
                                 "--batch-size", 64, "--output-prefix", base / "parquet" / "out",
                                 "--workers", 2, *common, bpe]))
    # Any Megatron tokenizer: NullTokenizer has no encode_batch (per-document tokenize, in forked
    # workers too) and raises on an empty string, which must be skipped as an empty document.
    (base / "numbers.txt").write_text("1 2 3\n\n40 5\n")
    (base / "null").mkdir()
    jobs.append(("null", ["--input", base / "numbers.txt", "--output-prefix", base / "null" / "out",
                          "--tokenizer-type", "NullTokenizer", "--vocab-size", 100, "--append-eod",
                          "--workers", 2]))
    jobs.append(("help", ["--help"]))

    # Bad input through the command line; each output directory holds an old pair.
    bad = base / "bad"
    bad.mkdir()
    big_good = [json.dumps({"text": t}) for t in make_docs(5, 3000)]
    (bad / "late.jsonl").write_text("\n".join(big_good + ['{"text": "cut off'] + big_good[:10]) + "\n")
    (bad / "nokey.jsonl").write_text("\n".join(big_good[:4] + ['{"title": "x"}'] + big_good[:3]) + "\n")
    (bad / "latin1.jsonl").write_bytes("\n".join(big_good[:6]).encode() + b'\n{"text": "caf\xe9"}\n')
    (bad / "empty.jsonl").write_text('{"text": ""}\n\n{"text": ""}\n')
    bad_cases = {
        "malformed": [bad / "late.jsonl", "--batch-size", 100, *common, bpe],
        "missing_key": [bad / "nokey.jsonl", *common, bpe],
        "not_utf8": [bad / "latin1.jsonl", *common, bpe],
        "all_empty": [bad / "empty.jsonl", *common, bpe],
        "uint16_too_small": [bad / "nokey.jsonl", "--dtype", "uint16", *common, big],
        "no_eod": [bad / "late.jsonl", "--append-eod", *common, big],
    }
    for name, args in bad_cases.items():
        out = base / "bad_out" / name
        out.mkdir(parents=True)
        old_pair(out / "data_text_document")
        cases[f"{name}_before"] = snapshot(out)
        cli[name] = Launched(tool("--input", *args[:1], "--output-prefix", out / "data", *args[1:]),
                             base / "logs" / name)

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


# Round trips ---------------------------------------------------------------------------------

def test_jsonl_two_keys_round_trip_and_workers_agree(runs):
    base, expect = runs["base"], runs["expect"]["jsonl"]
    cli, helper = runs["cli"]["jsonl_w2"].result(), runs["helper"]("jsonl_w1")
    for result in (cli, helper):
        assert_ok(result)
        line = summary(result)
        assert "307 documents" in line and "2 empty skipped (text 1, title 1)" in line
        assert "0 bad lines skipped" in line and "docs/s" in line and "tokens/s" in line and "MB/s" in line
    progress = [int(m.group(1)) for m in re.finditer(r"\] (\d+) documents, .* docs/s, .* tokens/s, .* MB/s",
                                                     cli["stdout"])]
    assert len(progress) == 3 and all(100 * (i + 1) <= n < 100 * (i + 1) + 64 for i, n in enumerate(progress))
    for key in ("text", "title"):
        docs, dtype = read_dataset(base / "w1" / f"out_{key}_document")
        assert docs == expect[key] and dtype == np.uint16
        for ext in (".bin", ".idx"):
            one = (base / "w1" / f"out_{key}_document{ext}").read_bytes()
            assert one == (base / "w2" / f"out_{key}_document{ext}").read_bytes(), (key, ext)
    assert sorted(os.listdir(base / "w1")) == sorted(os.listdir(base / "w2")) == [
        "out_text_document.bin", "out_text_document.idx", "out_title_document.bin", "out_title_document.idx"]


def test_output_is_byte_identical_to_indexed_dataset_builder(runs, tmp_path):
    """The tool's own output, and the writer on its own, against megatron-core's builder."""
    runs["cli"]["jsonl_w2"].result()
    for key, docs in runs["expect"]["jsonl"].items():
        ref = write_indexed_dataset(tmp_path / f"ref_{key}", docs, np.uint16)  # IndexedDatasetBuilder
        for ext in (".bin", ".idx"):
            ours = runs["base"] / "w2" / f"out_{key}_document{ext}"
            assert ours.read_bytes() == Path(f"{ref}{ext}").read_bytes(), (key, ext)

    rng = np.random.default_rng(0)
    for dtype, high in ((np.uint16, 65535), (np.int32, 2**31 - 1)):
        docs = [rng.integers(0, high, size=int(rng.integers(1, 300))) for _ in range(500)]
        ref = write_indexed_dataset(tmp_path / f"ref_{dtype.__name__}", docs, dtype)  # IndexedDatasetBuilder
        writer = IndexedDatasetWriter(str(tmp_path / f"ours_{dtype.__name__}"), dtype)
        writer.add_document(docs[0])
        for start in range(1, 500, 97):  # arrays of several documents, as the tool writes them
            part = docs[start:start + 97]
            writer.add_documents(np.concatenate(part).astype(dtype), [len(d) for d in part])
        writer.publish()
        for ext in (".bin", ".idx"):
            assert Path(writer.prefix + ext).read_bytes() == Path(f"{ref}{ext}").read_bytes(), (dtype, ext)


def test_line_text_through_glob(runs):
    result = runs["helper"]("glob")
    assert_ok(result)
    assert "7 documents" in summary(result) and "1 empty skipped" in summary(result)
    docs, dtype = read_dataset(runs["base"] / "glob" / "out_text_document")
    assert docs == runs["expect"]["glob"] and dtype == np.uint16
    # The dead run's temporary files are gone, and the run said so.
    assert not any(Path(p).exists() for p in runs["stale"])
    assert "left by an interrupted run" in result["stdout"]
    assert sorted(os.listdir(runs["base"] / "glob")) == ["out_text_document.bin", "out_text_document.idx"]


def test_directory_one_document_per_file_picks_int32_for_a_big_vocabulary(runs):
    result = runs["helper"]("dir")
    assert_ok(result)
    docs, dtype = read_dataset(runs["base"] / "dir" / "out_text_document")
    assert dtype == np.int32  # 70 000 tokens: Megatron's optimal_dtype says int32
    assert docs == runs["expect"]["dir"]
    assert max(max(d) for d in docs) >= 65536  # ids that uint16 would have wrapped


def test_forced_int32_and_skipped_bad_lines(runs):
    result = runs["helper"]("int32")
    assert_ok(result)
    line = summary(result)
    # 6 documents read (one of them empty, so 5 written); 5 bad lines skipped, and quoted on stderr.
    assert "6 documents" in line and "5 bad lines skipped" in line and "1 empty skipped" in line
    skipped = [ln for ln in result["stderr"].splitlines() if "skipped" in ln]
    mixed = runs["base"] / "mixed.jsonl"
    for where in (f"{mixed}:2: malformed JSON", f"{mixed}:4: missing key 'text'", f"{mixed}:6: not valid UTF-8",
                  f"{mixed}:7: key 'text' is a number", f"{mixed}:9: expected a JSON object"):
        assert any(where in ln for ln in skipped), (where, skipped)
    docs, dtype = read_dataset(runs["base"] / "int32" / "out_text_document")
    assert dtype == np.int32 and docs == runs["expect"]["int32"]


def test_parquet_round_trip(runs):
    if not runs["parquet"]:
        pytest.skip("pyarrow is not installed (pip install pyarrow)")
    result = runs["helper"]("parquet")
    assert_ok(result)
    for key in ("text", "title"):
        docs, _ = read_dataset(runs["base"] / "parquet" / f"out_{key}_document")
        assert docs == runs["expect"]["parquet"][key]


def test_other_megatron_tokenizer_without_encode_batch(runs):
    result = runs["helper"]("null")
    assert_ok(result)
    assert "(NullTokenizer)" in result["stdout"] and "batched" not in result["stdout"]
    assert "3 documents" in summary(result) and "1 empty skipped" in summary(result)
    docs, dtype = read_dataset(runs["base"] / "null" / "out_text_document")
    assert docs == [[1, 2, 3, 99], [40, 5, 99]] and dtype == np.uint16  # eod: vocab_size - 1


def test_help_lists_ours_and_megatrons_flags(runs):
    result = runs["helper"]("help")
    assert result["rc"] == 0
    for flag in ("--input", "--json-keys", "--append-eod", "--workers", "--dtype", "--skip-bad-lines",
                 "--tokenizer-type", "--tokenizer-model"):
        assert flag in result["stdout"], flag


# Bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, needles", [
    ("malformed", ["late.jsonl:3001: malformed JSON", "--skip-bad-lines"]),
    ("missing_key", ["nokey.jsonl:5: missing key 'text'"]),
    ("not_utf8", ["latin1.jsonl:7: not valid UTF-8"]),
    ("all_empty", ["no documents to write for key 'text'", "2 empty"]),
    ("uint16_too_small", ["--dtype uint16", "70000"]),
    ("no_eod", ["--append-eod", "no end-of-document token"]),
])
def test_bad_input_one_line_and_old_pair_untouched(runs, name, needles):
    result = runs["cli"][name].result()
    assert_one_line_error(result, *needles)
    out = runs["base"] / "bad_out" / name
    assert snapshot(out) == runs[f"{name}_before"]  # same files, same bytes: no temp file left


def test_cheap_mistakes_fail_fast(runs, tmp_path):
    """Missing paths are caught before the slow imports: one line, well under the ~7 s they take."""
    bpe = runs["bpe"]
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "emptydir" / "readme.md").write_text("no data here")
    good = runs["base"] / "jsonl" / "docs.jsonl"
    old_pair(tmp_path / "data_text_document")
    before = snapshot(tmp_path)
    cases = [
        (["--input", tmp_path / "nope.jsonl"], "nope.jsonl: no such file or directory", bpe),
        (["--input", str(tmp_path / "*.jsonl")], "no files match", bpe),
        (["--input", tmp_path / "emptydir"], "holds no data files", bpe),
        (["--input", good], "--tokenizer-model /nonexistent/tok: no such file or directory", "/nonexistent/tok"),
    ]
    for args, needle, tokenizer in cases:
        start = time.perf_counter()
        proc = subprocess.run(tool(*args, "--output-prefix", tmp_path / "data", "--tokenizer-type",
                                   "HuggingFaceTokenizer", "--tokenizer-model", tokenizer),
                              env=env(), capture_output=True, text=True, timeout=TIMEOUT)
        assert_one_line_error({"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}, needle)
        assert time.perf_counter() - start < 6
    assert snapshot(tmp_path) == before


def test_parquet_without_pyarrow_says_how_to_get_it(runs, tmp_path):
    """Whether or not pyarrow is installed here, a process where it cannot be imported says what to do."""
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")
    blocked = ("import runpy, sys; sys.modules['pyarrow'] = None; sys.argv = sys.argv[1:]; "
               "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", blocked, str(TOOL), "--input", str(tmp_path / "rows.parquet"),
                           "--output-prefix", str(tmp_path / "data"), "--tokenizer-type", "HuggingFaceTokenizer",
                           "--tokenizer-model", str(runs["bpe"])],
                          env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert_one_line_error({"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr},
                          "rows.parquet: reading parquet needs pyarrow (pip install pyarrow)")
    assert sorted(os.listdir(tmp_path)) == ["rows.parquet"]


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields after "pid (comm)": state, ppid, ...


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) and fields[1] == str(pid):
            found.append(int(entry))
    return found


def running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def test_killed_mid_run_leaves_no_complete_looking_pair(runs, tmp_path):
    """SIGKILL while the tool waits for more input on a FIFO: deterministic, mid-run, no cleanup possible."""
    out = tmp_path / "out"
    out.mkdir()
    old_pair(out / "data_text_document")
    before = snapshot(out)
    fifo = tmp_path / "stream.jsonl"
    os.mkfifo(fifo)
    lines = "".join(json.dumps({"text": t}) + "\n" for t in make_docs(6, 3000)).encode()
    release = threading.Event()

    def feed():
        try:
            with open(fifo, "wb") as f:  # blocks until the tool opens it
                f.write(lines)
                f.flush()
                release.wait(TIMEOUT)  # keep the FIFO open: the tool waits for more
        except BrokenPipeError:
            pass  # the reader was killed before it read everything: what this test does

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    proc = subprocess.Popen(tool("--input", fifo, "--output-prefix", out / "data", "--workers", 2,
                                 "--batch-size", 100, "--log-interval", 500, "--tokenizer-type",
                                 "HuggingFaceTokenizer", "--tokenizer-model", runs["bpe"]),
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    progress: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [progress.put(ln) for ln in proc.stdout], daemon=True).start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            line = progress.get(timeout=max(1.0, deadline - time.monotonic()))
            if " documents, " in line and int(line.split("] ")[1].split()[0]) >= 1000:
                break
        workers = children(proc.pid)
        assert len(workers) == 2
        temps = sorted(p for p in os.listdir(out) if p.endswith(".tmp"))
        assert temps and all(p.startswith(".") for p in temps)  # hidden, and clearly temporary
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # The workers die with their parent instead of waiting on their queue forever.
        deadline = time.monotonic() + 10
        while [w for w in workers if running(w)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if running(w)]
    finally:
        release.set()
        try:  # whatever is left of the session this test started (nothing, when it passes)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    after = snapshot(out)
    assert {k: v for k, v in after.items() if not k.endswith(".tmp")} == before  # old pair intact
    assert not [k for k in after if k.endswith((".bin", ".idx")) and k not in before]
    # The next run at this prefix clears what the killed one left (it checks the pid is gone).
    assert sorted(Path(p).name for p in remove_stale_temps(str(out / "data_text_document"))) == temps
    assert snapshot(out) == before


def test_tokenizer_json_fast_path_equals_megatrons_tokenizer(tmp_path):
    """A plain tokenizer.json is read without torch or Megatron (start-up under a second instead of
    ~7 s), and gives the bytes Megatron's own build_tokenizer path gives: the same command plus a
    Megatron tokenizer flag that does not apply to this tokenizer goes through Megatron's parser and
    build_tokenizer, and must write the same files."""
    from helpers.paths import SAMPLE_CORPUS, SAMPLE_TOKENIZER

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(SAMPLE_CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)[:300]))
    common = ["--input", corpus, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", SAMPLE_TOKENIZER,
              "--append-eod", "--workers", 2]
    code = ("import sys, runpy; sys.argv = sys.argv[1:]; sys.path.insert(0, sys.argv[0].rsplit('/', 1)[0])\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "finally:\n    print('TORCH_IMPORTED', 'torch' in sys.modules, 'MEGATRON_IMPORTED', 'megatron' in sys.modules)")
    fast = subprocess.run([sys.executable, "-c", code, str(TOOL), *map(str, common), "--output-prefix",
                           str(tmp_path / "fast")], env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert fast.returncode == 0, fast.stderr
    assert "TORCH_IMPORTED False MEGATRON_IMPORTED False" in fast.stdout, fast.stdout + fast.stderr
    slow = subprocess.run(tool(*common, "--output-prefix", tmp_path / "megatron", "--tiktoken-num-special-tokens",
                               1000), env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert slow.returncode == 0, slow.stderr
    for ext in (".bin", ".idx"):
        ours = (tmp_path / f"fast_text_document{ext}").read_bytes()
        assert ours == (tmp_path / f"megatron_text_document{ext}").read_bytes(), ext
    docs, dtype = read_dataset(tmp_path / "fast_text_document")
    assert len(docs) == 300 and dtype == np.uint16
