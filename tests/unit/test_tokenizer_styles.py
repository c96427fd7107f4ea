"""Each tokenizer style the supported families ship gives upstream's ids, or is not ours to give.

Reference: megatron-core's own ``HuggingFaceTokenizer`` (its wrapper over transformers'
``AutoTokenizer``), whose methods Megatron's ``MegatronTokenizerText`` forwards: ``tokenize`` is
``text_to_ids``, ``detokenize(ids, skip_special_tokens)`` is ``ids_to_text(ids, remove_special_tokens)``.
Ours is what Megatron's own ``build_tokenizer`` builds in a process set up as a training run
(patches/hf/tokenizer_json.py). The tokenizer directories are trained in the test
(tests/helpers/tokenizer_styles.py). A style the adaptor does not reproduce goes to upstream's
wrapper when transformers is installed and stops, naming the setting, when it is not; the same for
tools/preprocess_data.py.
"""
from __future__ import annotations

import argparse
import logging
import sys

import pytest

from helpers.processes import import_tool
from helpers.tokenizer_styles import REFUSED, STYLES, TEXTS, make_style

pytest.importorskip("transformers")  # the reference


@pytest.fixture(scope="module")
def style_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("styles")
    return {style: make_style(style, root / style) for style in STYLES + REFUSED}


def megatron_build(path, include_special_tokens: bool = True, extra=()):
    """Megatron's build_tokenizer from the user's flags."""
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training.arguments import _add_tokenizer_args

    parser = argparse.ArgumentParser()
    _add_tokenizer_args(parser)
    flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(path)]
    args = parser.parse_args(flags + ([] if include_special_tokens else ["--tokenizer-hf-no-include-special-tokens"])
                             + list(extra))
    args.rank, args.tensor_model_parallel_size, args.make_vocab_size_divisible_by = 0, 1, 128
    return build_tokenizer(args)


def upstream_wrapper(path, include_special_tokens: bool = True):
    from megatron.core.tokenizers.text.libraries import HuggingFaceTokenizer

    logging.disable(logging.WARNING)
    try:
        return HuggingFaceTokenizer(str(path), include_special_tokens=include_special_tokens)
    finally:
        logging.disable(logging.NOTSET)


def outputs_of_upstream(lib) -> dict:
    ids = [lib.text_to_ids(t) for t in TEXTS]
    return {"ids": ids,
            "text": [lib.ids_to_text(i) for i in ids],
            "text_skip": [lib.ids_to_text(i, remove_special_tokens=True) for i in ids],
            "text_keep": [lib.ids_to_text(i, remove_special_tokens=False) for i in ids],
            "eod": lib.eod, "bos": lib.bos_id, "pad": lib.pad_id, "unk": lib.unk_id, "vocab_size": lib.vocab_size}


def outputs_of_megatron(tok) -> dict:
    ids = [tok.tokenize(t) for t in TEXTS]
    return {"ids": ids,
            "text": [tok.detokenize(i) for i in ids],
            "text_skip": [tok.detokenize(i, skip_special_tokens=True) for i in ids],
            "text_keep": [tok.detokenize(i, skip_special_tokens=False) for i in ids],
            "eod": tok.eod, "bos": tok.bos, "pad": tok.pad, "unk": tok.unk, "vocab_size": tok.vocab_size}


@pytest.mark.parametrize("include_special_tokens", [True, False], ids=["special", "no_special"])
@pytest.mark.parametrize("style", STYLES)
def test_style_gives_upstream_ids(cpu_training_process, style_dirs, style, include_special_tokens):
    ours = megatron_build(style_dirs[style], include_special_tokens)
    assert type(ours._tokenizer).__name__ == "TokenizerJson"
    upstream = outputs_of_upstream(upstream_wrapper(style_dirs[style], include_special_tokens))
    got = outputs_of_megatron(ours)
    for key in ("ids", "text", "text_skip", "text_keep"):
        for text, mine, theirs in zip(TEXTS, got[key], upstream[key]):
            assert mine == theirs, f"{style} {key} of {text!r}"
    assert {k: got[k] for k in ("eod", "bos", "pad", "unk", "vocab_size")} == \
        {k: upstream[k] for k in ("eod", "bos", "pad", "unk", "vocab_size")}


def test_leading_space_llama2_shape(cpu_training_process, style_dirs):
    """A leading space under Metaspace with legacy false: the ids of upstream, not of the file as written."""
    from tokenizers import Tokenizer

    path = style_dirs["mistral"].parent / "llama2_legacy_false"
    as_written = Tokenizer.from_file(str(path / "tokenizer.json")).encode(" leading space").ids
    upstream = upstream_wrapper(path).text_to_ids(" leading space")
    assert as_written != upstream  # the file alone is not what transformers runs
    assert megatron_build(path).tokenize(" leading space") == upstream


@pytest.mark.parametrize("style", REFUSED)
def test_unreproduced_style_goes_to_upstream(cpu_training_process, style_dirs, style):
    from adaptor.tokenizer_json import unreproducible

    assert "tokenizer_class GPT2Tokenizer" in unreproducible(style_dirs[style])
    ours = megatron_build(style_dirs[style])
    assert type(ours._tokenizer).__name__ == "HuggingFaceTokenizer"
    upstream = upstream_wrapper(style_dirs[style])
    assert [ours.tokenize(t) for t in TEXTS] == [upstream.text_to_ids(t) for t in TEXTS]


def test_no_use_fast_asks_transformers(cpu_training_process, style_dirs):
    """--tokenizer-hf-no-use-fast is upstream's request to transformers: its wrapper builds the tokenizer
    even where tokenizer.json alone would give the same ids, and validation needs transformers for it."""
    from adaptor.errors import ArgumentError
    from patches.hf.tokenizer_json import TokenizerJsonSupport

    ours = megatron_build(style_dirs["mistral"], extra=["--tokenizer-hf-no-use-fast"])
    assert type(ours._tokenizer).__name__ == "HuggingFaceTokenizer"
    assert type(megatron_build(style_dirs["mistral"])._tokenizer).__name__ == "TokenizerJson"
    args = argparse.Namespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(style_dirs["mistral"]),
                              vocab_file=None, tokenizer_hf_no_use_fast=True)
    TokenizerJsonSupport().validate(args, None)
    saved = sys.modules.get("transformers")
    sys.modules["transformers"] = None  # as on an image without it
    try:
        with pytest.raises(ArgumentError, match="--tokenizer-hf-no-use-fast asks transformers"):
            TokenizerJsonSupport().validate(args, None)
    finally:
        sys.modules["transformers"] = saved


@pytest.mark.parametrize("style", REFUSED)
def test_unreproduced_style_refused_without_transformers(cpu_training_process, style_dirs, style, monkeypatch,
                                                          tmp_path, capsys):
    from adaptor.errors import ArgumentError
    from patches.hf.tokenizer_json import TokenizerJsonSupport

    monkeypatch.setitem(sys.modules, "transformers", None)  # as on an image without it
    args = argparse.Namespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(style_dirs[style]),
                              vocab_file=None)
    with pytest.raises(ArgumentError) as refused:
        TokenizerJsonSupport().validate(args, None)
    line = str(refused.value)
    assert "\n" not in line and "tokenizer_class GPT2Tokenizer" in line and "install transformers" in line

    corpus = tmp_path / "in.jsonl"
    corpus.write_text('{"text": "hello world"}\n')
    preprocess = import_tool("preprocess_data")
    status = preprocess.main(["--input", str(corpus), "--output-prefix", str(tmp_path / "out"),
                              "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(style_dirs[style])])
    err = capsys.readouterr().err.strip().splitlines()
    assert status != 0 and len(err) == 1 and "tokenizer_class GPT2Tokenizer" in err[0]
    assert not list(tmp_path.glob("out*"))  # nothing written


@pytest.mark.parametrize("style", STYLES + REFUSED)
def test_preprocess_data_follows_the_same_rule(style_dirs, style):
    """The tool's own fast path is taken for exactly the styles TokenizerJson reproduces."""
    preprocess = import_tool("preprocess_data")
    opts = argparse.Namespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(style_dirs[style]),
                              vocab_file=None, merge_file=None)
    assert preprocess.plain_tokenizer_json(opts) is (style not in REFUSED)
