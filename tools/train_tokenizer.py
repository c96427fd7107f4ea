"""Train a byte-level BPE tokenizer with the `tokenizers` library and save it as a Hugging Face directory.

    python tools/train_tokenizer.py --input examples/data/sample_corpus.jsonl \\
        --vocab-size 4096 --output-dir examples/data/tokenizer

Writes ``tokenizer.json`` and a ``tokenizer_config.json`` that names the
special tokens (``<|endoftext|>`` ends a document, ``<|pad|>`` pads), so both
``--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR`` and
transformers' ``AutoTokenizer.from_pretrained(DIR)`` read the same ids.
Byte-level BPE, as GPT-2 and Qwen use, so any UTF-8 text encodes without an
unknown token. Training on the same input gives the same file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]


def iter_texts(paths, key: str):
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if path.endswith((".jsonl", ".json")):
                    line = line.strip()
                    if line:
                        yield json.loads(line)[key]
                elif line.strip():
                    yield line


def train(paths, vocab_size: int, key: str = "text"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(iter_texts(paths, key), trainer)
    return tokenizer


def save(tokenizer, output_dir: str, max_length: int) -> None:
    os.makedirs(output_dir, exist_ok=True)
    tokenizer.save(os.path.join(output_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
        "bos_token": None,
        "unk_token": None,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(output_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="JSONL or text files")
    parser.add_argument("--json-key", default="text")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--model-max-length", type=int, default=4096)
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args(argv)
    for path in args.input:
        if not os.path.isfile(path):
            parser.error(f"--input {path}: no such file")
    tokenizer = train(args.input, args.vocab_size, args.json_key)
    save(tokenizer, args.output_dir, args.model_max_length)
    print(f"trained a {tokenizer.get_vocab_size()}-token BPE tokenizer into {args.output_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
