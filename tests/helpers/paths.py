"""Where things are, independent of which folder a test file lives in."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
TESTS = ROOT / "tests"
TOOLS = ROOT / "tools"
EXAMPLES = ROOT / "examples"
STANDIN = TESTS / "npu_standin"  # the torch_npu stand-in package's parent
# The corpus and tokenizer the repository carries (examples/data/README.md).
SAMPLE_CORPUS = EXAMPLES / "data" / "sample_corpus.jsonl"
SAMPLE_TOKENIZER = EXAMPLES / "data" / "tokenizer"
