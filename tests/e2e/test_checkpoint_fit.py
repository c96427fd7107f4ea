"""A checkpoint that does not fit the model the flags build is one line, and the padded vocabulary
recorded by tools/convert_ckpt.py is taken on --load.

The offline Qwen3 path as users meet it: the Hugging Face embedding has more rows than the
tokenizer has tokens (Qwen3: 151,936 rows, 151,669 tokens). Here the tiny model has 1,664 rows
(a multiple of 128, as 151,936 is) and the embedded tokenizer 1,440 tokens, which Megatron would pad
to 1,536: without the record the model and the checkpoint disagree.
"""
from __future__ import annotations

import json
import math
import shutil

import pytest
from safetensors import safe_open

from helpers.hf_fixtures import make_tiny_qwen3
from helpers.megatron_runs import SAMPLE_CORPUS, SAMPLE_TOKENIZER, TINY_QWEN3, run_pretrain, side_by_side, tail
from helpers.one_line_errors import PREFIX, error_lines
from helpers.prefetch import prefetched
from helpers.processes import run_tool

from adaptor.convert import Layout, convert_hf_to_megatron, megatron_args_from_hf_config

HF_ROWS = 1664
TOKENIZER_TOKENS = 1440


def _data(tmp_path):
    proc = run_tool("preprocess_data.py", "--input", SAMPLE_CORPUS, "--output-prefix", tmp_path / "corpus",
                    "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", SAMPLE_TOKENIZER, "--append-eod",
                    timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(tmp_path / "corpus_text_document")


def _train_flags(hf_dir, data, load, save=None):
    model = megatron_args_from_hf_config("qwen3", json.loads((hf_dir / "config.json").read_text()))
    i = model.index("--vocab-size")
    del model[i:i + 2]  # the tokenizer gives the vocabulary, as with a real Qwen3 tokenizer
    flags = model + [
        "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
        "--train-iters", "3", "--seed", "1234", "--log-interval", "1", "--eval-iters", "0",
        "--eval-interval", "100000", "--attention-dropout", "0", "--hidden-dropout", "0",
        "--data-path", data, "--split", "100,0,0", "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", str(SAMPLE_TOKENIZER),
        "--load", str(load), "--ckpt-format", "torch", "--no-load-optim", "--no-load-rng", "--finetune"]
    if save:
        flags += ["--save", str(save), "--save-interval", "3"]
    return flags


def test_offline_qwen3_with_a_smaller_tokenizer_trains_and_converts_back(tmp_path):
    hf = make_tiny_qwen3(tmp_path / "hf", tied=False, vocab_size=HF_ROWS)
    converted = convert_hf_to_megatron(hf, tmp_path / "mg", "qwen3", Layout(), save_format="torch")
    unrecorded = shutil.copytree(converted, tmp_path / "mg_unrecorded")
    (unrecorded / "hf" / "conversion.json").unlink()
    data = _data(tmp_path)

    trained, refused = side_by_side(
        lambda: run_pretrain(_train_flags(hf, data, converted, save=tmp_path / "trained")),
        lambda: run_pretrain(_train_flags(hf, data, unrecorded)))
    assert trained.returncode == 0, tail(trained.output)
    assert f"padded vocabulary {HF_ROWS}, as recorded in" in trained.output
    assert sorted(trained.losses) == [1, 2, 3] and all(math.isfinite(x) for x in trained.curve())
    # The loaded weights: a fresh init starts near ln(rows); these random HF weights do not.
    # Without the record Megatron pads the tokenizer's 1,440 tokens to 1,536 rows: one line, the fix named.
    assert refused.returncode != 0
    assert error_lines(refused.output) == [
        f"{PREFIX} --load {unrecorded}: tensor embedding.word_embeddings.weight has shape [{HF_ROWS}, 64] in the "
        f"checkpoint but [1536, 64] in the model these flags build; the checkpoint's vocabulary is padded to "
        f"{HF_ROWS} rows: pass --padded-vocab-size {HF_ROWS}"], tail(refused.output)

    # Back to Hugging Face: every row of the embedding and output layer, as many as config.json says.
    back = tmp_path / "hf_back"
    proc = run_tool("convert_ckpt.py", "--load-model-type", "mg", "--save-model-type", "hf", "--model-type-hf", "qwen3",
                    "--load-dir", tmp_path / "trained", "--save-dir", back, "--hf-config-dir", hf, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for shard in back.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            rows.update({k: f.get_slice(k).get_shape()[0] for k in f.keys() if "embed" in k or "lm_head" in k})
    assert rows == {"model.embed_tokens.weight": HF_ROWS, "lm_head.weight": HF_ROWS}
    assert json.loads((back / "config.json").read_text())["vocab_size"] == HF_ROWS


def test_padded_vocab_size_smaller_than_the_tokenizer_is_one_line(tmp_path):
    run = run_pretrain(TINY_QWEN3 + ["--train-iters", "1", "--padded-vocab-size", "384"])
    assert run.returncode != 0
    assert error_lines(run.output) == [f"{PREFIX} --padded-vocab-size 384 is smaller than the tokenizer's "
                                       f"vocabulary (512 tokens); pass at least 512"], tail(run.output)


@prefetched
def saved(tmp_path_factory):
    """One-iteration checkpoints of the tiny Qwen3 (512-token vocabulary) in every format."""
    root = tmp_path_factory.mktemp("saved")
    runs = side_by_side(*[
        (lambda fmt=fmt: run_pretrain(TINY_QWEN3 + ["--train-iters", "1", "--save", str(root / fmt),
                                                    "--save-interval", "1", "--ckpt-format", fmt]))
        for fmt in ("torch", "torch_dist", "safetensors")])
    for run in runs:
        assert run.returncode == 0, tail(run.output)
    return root


def _vocab(args, size):
    args = list(args)
    args[args.index("--vocab-size") + 1] = str(size)
    return args


@pytest.mark.parametrize("fmt", ["torch", "torch_dist", "safetensors"])
def test_a_shape_the_checkpoint_cannot_fill_is_one_line(saved, fmt):
    """A wider FFN in every format; a larger vocabulary in torch_dist, which used to load it silently."""
    load = ["--train-iters", "2", "--load", str(saved / fmt), "--ckpt-format", fmt, "--no-load-optim",
            "--no-load-rng", "--finetune"]
    wider = list(TINY_QWEN3)
    wider[wider.index("--ffn-hidden-size") + 1] = "256"
    runs = side_by_side(lambda: run_pretrain(wider + load),
                        lambda: run_pretrain(_vocab(TINY_QWEN3, 600) + load))
    ffn, vocab = runs
    where = saved / fmt if fmt == "torch" else saved / fmt / "iter_0000001"
    assert ffn.returncode != 0 and len(error_lines(ffn.output)) == 1, tail(ffn.output)
    line = error_lines(ffn.output)[0]
    # torch names each layer's tensor; the sharded formats stack layers under one key ([layers, rows, cols])
    assert line.startswith(f"{PREFIX} --load {where}: tensor decoder.layers."), line
    assert "mlp.linear_fc1.weight has shape " in line, line
    assert line.endswith("check --ffn-hidden-size"), line
    assert vocab.returncode != 0, tail(vocab.output)
    if fmt == "safetensors":  # the checkpoint records its 512 rows: the tokenizer is the problem
        assert error_lines(vocab.output) == [
            f"{PREFIX} the checkpoint under {saved / fmt} has a vocabulary of 512 rows "
            f"({where / 'common.json'}), fewer than the tokenizer's 600 tokens; train with the tokenizer it was "
            f"made for"], tail(vocab.output)
    else:
        assert error_lines(vocab.output) == [
            f"{PREFIX} --load {where}: tensor embedding.word_embeddings.weight has shape [512, 64] in the "
            f"checkpoint but [640, 64] in the model these flags build; the checkpoint's vocabulary is padded to "
            f"512 rows: pass --padded-vocab-size 512"], tail(vocab.output)


def test_padding_rows_alone_may_differ(saved):
    """torch_dist and safetensors reshard vocabulary padding (Megatron marks it allow_shape_mismatch):
    a model padded to 640 rows loads the 512-row checkpoint of a 512-token tokenizer, and says so."""
    run = run_pretrain(TINY_QWEN3 + ["--train-iters", "2", "--load", str(saved / "torch_dist"), "--ckpt-format",
                                     "torch_dist", "--no-load-optim", "--no-load-rng", "--finetune",
                                     "--padded-vocab-size", "640"])
    assert run.returncode == 0, tail(run.output)
    assert ("loading embedding.word_embeddings.weight: 512 rows in the checkpoint, 640 in the model "
            "(padding only: the tokenizer has 512 tokens)") in run.output
