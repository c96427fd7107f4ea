"""--tokenizer-type HuggingFaceTokenizer through the `tokenizers` library (patches/hf/tokenizer_json.py).

Reference: megatron-core's own HuggingFaceTokenizer wrapper over transformers'
AutoTokenizer, built by the same ``build_tokenizer(args)`` call in a process
without the adaptor. Ours is built in a process where transformers cannot be
imported at all, so it cannot lean on it. Both must give the same ids, special
ids, vocabulary size and padded vocabulary size.
"""
from __future__ import annotations

import importlib.util
import json

import pytest

from helpers.megatron_runs import side_by_side
from helpers.paths import SAMPLE_TOKENIZER
from helpers.processes import child_env, run_child
from helpers.prefetch import prefetched

TOKENIZER_DIR = SAMPLE_TOKENIZER
TEXTS = [
    "Mira was a baker who lived in Rymouth.",
    "  leading spaces, trailing spaces  ",
    "Lines\nand\ttabs\n\n",
    "naïve café — 東京 🙂 unseen bytes",
    "a document<|endoftext|>and the next",
    "",
]

BUILD = r"""
import argparse, json, sys
if sys.argv[1] == "adaptor":
    sys.modules["transformers"] = None  # ours must not need it
    import adaptor  # noqa: F401
from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
from megatron.training.arguments import _add_tokenizer_args
parser = argparse.ArgumentParser()
_add_tokenizer_args(parser)
args = parser.parse_args(["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", sys.argv[2]])
args.rank, args.tensor_model_parallel_size, args.make_vocab_size_divisible_by = 0, 2, 128
tok = build_tokenizer(args)
texts = json.loads(sys.argv[3])
ids = [tok.tokenize(t) for t in texts]
print("RESULT " + json.dumps({
    "library": type(tok._tokenizer).__name__,
    "vocab_size": tok.vocab_size, "padded_vocab_size": args.padded_vocab_size,
    "eod": tok.eod, "pad": tok.pad, "bos": tok.bos,
    "ids": ids, "text": [tok.detokenize(i) for i in ids],
}))
"""


def build(mode: str, path, texts=TEXTS) -> dict:
    # Ours cold: "transformers cannot be imported" holds only in an interpreter that never imported it.
    proc = run_child(BUILD, mode, path, json.dumps(texts), env=child_env(ADAPTOR_QUIET="1"), timeout=300,
                     warm=mode != "adaptor")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@prefetched
def bare_tokenizer_json(tmp_path_factory):
    """A bare tokenizer.json (no tokenizer_config.json)."""
    bare = tmp_path_factory.mktemp("only") / "tokenizer.json"
    bare.write_bytes((TOKENIZER_DIR / "tokenizer.json").read_bytes())
    return bare


@prefetched
def builds(bare_tokenizer_json):
    """Every build this file compares, two processes at a time."""
    jobs = {"ours": lambda: build("adaptor", TOKENIZER_DIR),
            "bare": lambda: build("adaptor", bare_tokenizer_json, texts=["hello world"])}
    if importlib.util.find_spec("transformers") is not None:
        jobs["upstream"] = lambda: build("upstream", TOKENIZER_DIR)
    return dict(zip(jobs, side_by_side(*jobs.values())))


def test_matches_megatron_transformers_wrapper(builds):
    pytest.importorskip("transformers")
    ours, upstream = dict(builds["ours"]), dict(builds["upstream"])
    assert ours["library"] == "TokenizerJson" and upstream["library"] == "HuggingFaceTokenizer"
    assert ours.pop("library") and upstream.pop("library")
    assert ours == upstream
    # The embedded tokenizer's config names both; Megatron's eod is the eos token.
    assert (ours["eod"], ours["pad"], ours["bos"]) == (0, 1, None)
    assert ours["padded_vocab_size"] % 256 == 0 and ours["padded_vocab_size"] >= ours["vocab_size"]


def test_tokenizer_json_file_without_config(builds, bare_tokenizer_json):
    """A bare tokenizer.json (no tokenizer_config.json): eod is the special <|endoftext|>."""
    bare = bare_tokenizer_json
    result = builds["bare"]
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(bare))
    assert result["eod"] == reference.token_to_id("<|endoftext|>")
    assert result["pad"] is None
    assert result["ids"] == [reference.encode("hello world").ids]
