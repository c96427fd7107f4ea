"""Tokenizer directories of each style the supported model families ship, built with ``tokenizers``.

Each is a tiny model trained in-process on a small text, saved as ``tokenizer.json`` with a
``tokenizer_config.json`` whose keys are those the Hub's real files carry for that family:

* ``llama3``: byte-level BPE; the post-processor template adds ``<|begin_of_text|>``;
  ``PreTrainedTokenizerFast``.
* ``qwen``: byte-level BPE with NFC, no BOS; ``Qwen2Tokenizer``; ``bos_token: null``.
* ``llama2`` / ``mistral`` / ``yi``: sentencepiece-shaped BPE with byte fallback (``▁`` for spaces);
  ``LlamaTokenizerFast`` with ``add_bos_token``, ``legacy`` true / false; Yi without BOS.
* ``llama2_eos``: the same with ``add_eos_token: true``.
* ``bytelevel_eos``: byte-level ``PreTrainedTokenizerFast`` with ``add_bos_token``/``add_eos_token`` true.
* ``deepseek_v3``: ``LlamaTokenizerFast`` class over a byte-level tokenizer.json; ``add_bos_token``
  true, ``add_eos_token`` false.
* ``gpt2_class``: byte-level, ``GPT2Tokenizer``: a class whose pipeline the adaptor does not rebuild.
"""
from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "def train(model, data):\n    for batch in data:\n        loss = model(batch)\n\treturn loss\n",
    "Megatron trains large language models on many devices at once. ",
    "Mira was a baker who lived in Rymouth, where the leading winds blew. ",
    "  spaces   and\ttabs\nand newlines\n\n",
    "你好世界，中文文本。 ",
    "numbers 0123456789 and symbols {}[]()<>=+-*/#",
] * 20

TEXTS = [
    "",
    " leading space",
    "Hello world",
    "  two  spaces   three    ",
    "line one\nline two\n\n\tindented\t tab",
    "你好，世界。中文文本",
    "emoji 😀🎉 and 🙂",
    "def f(x):\n    return x ** 2  # square\n",
    "trailing space ",
    "\n",
    "one<s>two</s> three",
    "end<|endoftext|>next<|eot_id|> and <|im_start|>",
]


# The split Qwen2's tokenizer.json writes before its byte-level step.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _bytelevel(specials: list[str], qwen_split: bool = False):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if qwen_split:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _metaspace(legacy_file: bool):
    """Llama 2's file shape (legacy_file: normalizer Prepend+Replace, no pre-tokenizer) or Mistral's
    newer one (Metaspace pre-tokenizer, prepend_scheme first)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"] + bytes_,
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if legacy_file:
        tok.pre_tokenizer = None
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def _write(path: Path, tok, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    data = json.loads(tok.to_str())
    # sentencepiece's byte pieces live in the model's vocabulary, not among the added tokens
    data["added_tokens"] = [t for t in data["added_tokens"] if not t["content"].startswith("<0x")]
    (path / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return path


def _added(tok, tokens) -> dict:
    return {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for t in tokens}


def make_style(style: str, path) -> Path:
    from tokenizers import normalizers, processors

    path = Path(path)
    if style == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
        tok = _bytelevel(specials)
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
        return _write(path, tok, {
            "added_tokens_decoder": _added(tok, specials), "bos_token": "<|begin_of_text|>",
            "clean_up_tokenization_spaces": True, "eos_token": "<|end_of_text|>",
            "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast"})
    if style in ("qwen", "bytelevel_eos"):
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = _bytelevel(specials, qwen_split=style == "qwen")
        tok.normalizer = normalizers.NFC()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        if style == "qwen":
            return _write(path, tok, {
                "add_prefix_space": False, "added_tokens_decoder": _added(tok, specials),
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
                "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
                "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
                "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
        return _write(path, tok, {
            "add_bos_token": True, "add_eos_token": True, "added_tokens_decoder": _added(tok, specials),
            "bos_token": "<|im_start|>", "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
            "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"})
    if style == "gpt2_class":  # a class this project does not rebuild: upstream's wrapper or a refusal
        tok = _bytelevel(["<|endoftext|>"])
        return _write(path, tok, {"add_prefix_space": False, "bos_token": "<|endoftext|>",
                                  "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                                  "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer"})
    if style == "deepseek_v3":
        specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
        tok = _bytelevel(specials)
        bos = tok.token_to_id(specials[0])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{specials[0]}:0 $A:0", pair=f"{specials[0]}:0 $A:0 {specials[0]}:1 $B:1",
            special_tokens=[(specials[0], bos)])
        return _write(path, tok, {
            "add_bos_token": True, "add_eos_token": False, "bos_token": {"__type": "AddedToken",
            "content": specials[0], "lstrip": False, "normalized": True, "rstrip": False, "single_word": False},
            "clean_up_tokenization_spaces": False, "eos_token": {"__type": "AddedToken", "content": specials[1],
            "lstrip": False, "normalized": True, "rstrip": False, "single_word": False},
            "legacy": True, "model_max_length": 131072, "pad_token": {"__type": "AddedToken",
            "content": specials[1], "lstrip": False, "normalized": True, "rstrip": False, "single_word": False},
            "sp_model_kwargs": {}, "unk_token": None, "tokenizer_class": "LlamaTokenizerFast"})
    sentencepiece = {
        "llama2": (True, dict(add_bos_token=True, add_eos_token=False, legacy=True)),
        "llama2_legacy_false": (True, dict(add_bos_token=True, add_eos_token=False, legacy=False)),
        "mistral": (False, dict(add_bos_token=True, add_eos_token=False, legacy=False)),
        "mistral_legacy": (False, dict(add_bos_token=True, add_eos_token=False, legacy=True)),
        "yi": (True, dict(add_bos_token=False, add_eos_token=False, legacy=True)),
        "llama2_eos": (True, dict(add_bos_token=True, add_eos_token=True, legacy=False)),
    }
    legacy_file, flags = sentencepiece[style]
    tok = _metaspace(legacy_file)
    config = {**flags, "added_tokens_decoder": _added(tok, ["<unk>", "<s>", "</s>"]), "bos_token": "<s>",
              "clean_up_tokenization_spaces": False, "eos_token": "</s>", "model_max_length": 1000000000000000019884624838656,
              "pad_token": None, "sp_model_kwargs": {}, "spaces_between_special_tokens": False,
              "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>", "use_default_system_prompt": False}
    return _write(path, tok, config)


# Styles the adaptor tokenizes itself; REFUSED ones go to upstream's wrapper (or stop without transformers).
REFUSED = ("gpt2_class",)
STYLES = ("llama3", "qwen", "bytelevel_eos", "deepseek_v3", "llama2", "llama2_legacy_false", "mistral",
          "mistral_legacy", "yi", "llama2_eos")
