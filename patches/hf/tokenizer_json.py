"""``--tokenizer-type HuggingFaceTokenizer`` from a ``tokenizer.json``, without transformers.

Upstream: ``megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText._restore_model``
builds ``libraries.HuggingFaceTokenizer``, which wraps transformers'
``AutoTokenizer``. transformers is a large dependency that training does not
otherwise need, and it is often absent on NPU images. Every tokenizer on the
Hub that has a fast version ships a ``tokenizer.json``, which the
``tokenizers`` library (a dependency of ours) reads directly. When
``--tokenizer-model`` names such a file, or a directory that holds one, we
build :class:`adaptor.tokenizer_json.TokenizerJson` instead; anything else (a sentencepiece
model, ``--vocab-file``/``--merge-file``) still goes to the original.

TokenizerJson gives upstream's ids or is not used: a tokenizer whose transformers class it does not
reproduce (``adaptor.tokenizer_json.unreproducible`` names the setting) goes to the original wrapper
when transformers is installed, and stops the run at validation, naming the setting, when it is not.
The patch can go when Megatron reads tokenizer.json without transformers itself.
"""
from __future__ import annotations

import os

from adaptor.features import ArgumentError, Feature
from adaptor.tokenizer_json import TOKENIZER_FILE, TokenizerJson, find_tokenizer_json, refusal, unreproducible

OWNER = __name__


def _restore_model(wrapped, instance, call_args, kwargs):
    # --tokenizer-hf-no-use-fast (use_fast=False) asks transformers itself for the tokenizer: upstream's
    # wrapper builds it, whatever transformers makes of the request (its 5.x releases build the fast one)
    if getattr(instance, "library", None) == "huggingface" and not kwargs.get("vocab_file") \
            and kwargs.get("use_fast", True) is not False:
        if find_tokenizer_json(instance.path) is not None:
            reason = unreproducible(instance.path)
            if reason is None:
                return TokenizerJson(instance.path, **kwargs)
            if not _transformers_available():  # validate() stops training first; other callers stop here
                raise ArgumentError(refusal(reason))
    return wrapped(*call_args, **kwargs)


def _transformers_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


class TokenizerJsonSupport(Feature):
    name = "tokenizer_json"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper(
            "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText._restore_model",
            _restore_model, OWNER,
        )

    def validate(self, args, ctx) -> None:
        if getattr(args, "tokenizer_type", None) != "HuggingFaceTokenizer":
            return
        path = getattr(args, "tokenizer_model", None)
        if not path:
            raise ArgumentError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model "
                                "(a tokenizer.json file or a directory holding one)")
        if args.vocab_file:
            return
        if getattr(args, "tokenizer_hf_no_use_fast", False):
            if not _transformers_available():
                raise ArgumentError("--tokenizer-hf-no-use-fast asks transformers for its tokenizer, and transformers "
                                    "is not installed (pip install transformers, or drop the flag to read "
                                    f"{TOKENIZER_FILE} without it)")
            return
        if find_tokenizer_json(path) is not None:
            reason = unreproducible(path)
            if reason is not None and not _transformers_available():
                raise ArgumentError(refusal(reason))
            return
        if not os.path.exists(path) and "/" in path.strip("/") and path.count("/") == 1 and _transformers_available():
            return  # a Hub name such as Qwen/Qwen3-0.6B: transformers resolves it
        if not os.path.exists(path):
            raise ArgumentError(f"--tokenizer-model {path}: no such file or directory")
        if not _transformers_available():
            raise ArgumentError(
                f"--tokenizer-model {path}: holds no {TOKENIZER_FILE}, and reading other tokenizer "
                f"formats needs transformers (pip install transformers)"
            )
