"""``--fim-data``: the fields pretrain_gpt.py gives Megatron's GPTFIMDataset, and the samples it then
reads, on the sample corpus and the sample tokenizer with Megatron's default FIM tokens added (the
tokenizer the functional cases use: tools/megatron_cases/run.py).

The samples are checked against the same dataset without FIM (same seed, so the same documents in the
same order): every document piece that ends at an EOD comes back as ``<fim_prefix> prefix
<fim_suffix> suffix <fim_middle> middle`` (PSM) or ``<fim_prefix> <fim_suffix> suffix <fim_middle>
prefix middle`` (SPM), whose text, put back in order, is the piece's text. A tokenizer without the
tokens is refused by the flag that names them. The whole run: the Megatron-LM FIM case in
tests/e2e/test_megatron_cases.py.
"""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from helpers.processes import import_tool

run = import_tool("megatron_cases.run")


def fim_args(**overrides) -> argparse.Namespace:
    args = dict(fim_rate=1.0, fim_spm_rate=0.0, fim_split_sample=None, fim_fragment_rate=None, fim_no_prefix=None,
                fim_prefix_token="<fim_prefix>", fim_middle_token="<fim_middle>", fim_suffix_token="<fim_suffix>",
                fim_pad_token="<fim_pad>", fim_eod_token="<|endoftext|>")
    return argparse.Namespace(**{**args, **overrides})


def tokenizer(path):
    from megatron.core.tokenizers import MegatronTokenizer

    return MegatronTokenizer.from_pretrained(tokenizer_path=str(path), metadata_path={"library": "huggingface"})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from pathlib import Path

    prefix = run.corpus(tmp_path_factory.mktemp("fim"))
    return prefix, tokenizer(Path(prefix).parent / run.FIM_TOKENIZER)


def datasets(corpus, spm_rate: float):
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split
    from megatron.training.datasets.fim_dataset import GPTFIMDataset, GPTFIMDatasetConfig

    from adaptor.fim_data import fim_fields

    prefix, tok = corpus
    common = dict(random_seed=5, sequence_length=64, split="100,0,0", tokenizer=tok, reset_position_ids=False,
                  reset_attention_mask=False, eod_mask_loss=False)
    indexed = IndexedDataset(prefix)
    docs = np.arange(len(indexed.document_indices) - 1, dtype=np.int32)
    plain = GPTDataset(indexed, prefix, docs, 16, Split.train, GPTDatasetConfig(**common))
    fim = GPTFIMDataset(indexed, prefix, docs, 16, Split.train,
                        GPTFIMDatasetConfig(**common, **fim_fields(fim_args(fim_spm_rate=spm_rate), tok)))
    return plain, fim


def text_of(sample) -> list[int]:
    return [*sample["tokens"].tolist(), int(sample["labels"][-1])]


def pieces(ids: list[int], eod: int) -> list[list[int]]:
    """The non-empty pieces that end at an EOD (the last one may be cut at the sample's end)."""
    out, start = [], 0
    for i, t in enumerate(ids):
        if t == eod:
            if i > start:
                out.append(ids[start:i])
            start = i + 1
    return out


@pytest.mark.parametrize("order,spm_rate", [("psm", 0.0), ("spm", 1.0)])
def test_every_piece_is_permuted_around_the_sentinels_and_keeps_its_text(corpus, order, spm_rate):
    _, tok = corpus
    plain, fim = datasets(corpus, spm_rate)
    pre, mid, suf = (tok._tokenizer.tokens_to_ids([t])[0] for t in run.FIM_TOKENS[:3])
    eod = tok._tokenizer.tokens_to_ids(["<|endoftext|>"])[0]
    text = lambda ids: tok._tokenizer.ids_to_text(ids, remove_special_tokens=True)  # noqa: E731
    checked = 0
    for i in range(len(fim)):
        for original, permuted in zip(pieces(text_of(plain[i]), eod), pieces(text_of(fim[i]), eod)):
            assert permuted[0] == pre and permuted.count(suf) == permuted.count(mid) == 1, permuted
            s, m = permuted.index(suf), permuted.index(mid)
            if order == "psm":
                assert 0 < s < m, permuted
                restored = text(permuted[1:s]) + text(permuted[m + 1:]) + text(permuted[s + 1:m])
            else:
                assert s == 1 and m > s, permuted
                restored = text(permuted[m + 1:]) + text(permuted[2:m])
            assert restored == text(original)
            checked += 1
    assert checked >= 8, checked


def test_a_tokenizer_without_the_tokens_is_refused_by_the_flag_that_names_them(corpus):
    from adaptor.fim_data import fim_fields

    with pytest.raises(ValueError, match=r"^--fim-prefix-token <fim_prefix>: the tokenizer has no such token"):
        fim_fields(fim_args(), tokenizer(run.TOKENIZER))  # the sample tokenizer itself has no FIM tokens
    _, tok = corpus
    with pytest.raises(ValueError, match=r"^--fim-middle-token <MID>: the tokenizer has no such token"):
        fim_fields(fim_args(fim_middle_token="<MID>"), tok)
    with pytest.raises(ValueError, match=r"^--fim-split-sample two words: not one token"):
        fim_fields(fim_args(fim_split_sample="two words"), tok)
    with pytest.raises(ValueError, match=r"^--fim-rate 1.5"):
        fim_fields(fim_args(fim_rate=1.5), tok)


def test_pretrain_gpt_reads_fim_data_through_megatrons_fim_dataset(corpus, model_parallel, capsys):
    """pretrain_gpt.py's own dataset provider, in this process set up as a training run: --fim-data
    builds GPTFIMDataset samples; with a tokenizer that lacks the tokens it stops in one line."""
    import sys
    from pathlib import Path

    from megatron.training import global_vars
    from megatron.training.arguments import parse_args

    root = str(Path(run.ROOT))
    if root not in sys.path:
        sys.path.insert(0, root)
    import pretrain_gpt

    prefix, tok = corpus

    def provider(tokenizer_dir):
        sys.argv = ["pretrain_gpt.py", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                    str(tokenizer_dir), "--data-path", prefix, "--split", "100,0,0", "--seq-length", "64",
                    "--fim-data", "--fim-rate", "1.0", "--fim-spm-rate", "0.0"]
        args = parse_args()
        args.rank = 0
        global_vars.set_args(args)
        global_vars.rebuild_tokenizer(args)
        return pretrain_gpt.train_valid_test_datasets_provider([4, 0, 0])

    argv = sys.argv
    try:
        train, _, _ = provider(Path(prefix).parent / run.FIM_TOKENIZER)
        assert type(train).__name__ == "GPTFIMDataset"
        assert int(train[0]["tokens"][0]) == tok._tokenizer.tokens_to_ids(["<fim_prefix>"])[0]
        global_vars.unset_global_variables()
        with pytest.raises(SystemExit) as exit_:
            provider(run.TOKENIZER)
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].startswith(
            "megatron-adaptor: error: --fim-prefix-token <fim_prefix>: the tokenizer has no such token")
    finally:
        sys.argv = argv
        global_vars.unset_global_variables()
