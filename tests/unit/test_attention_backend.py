"""--attention-backend mapped onto this backend's attention kernels (adaptor.command_line.attention_backend).

Training through the mapping: tests/e2e/test_flash_attention.py (flash at TP=2, loss equal to --use-flash-attn).
"""
from __future__ import annotations

import pytest

from adaptor.command_line.attention_backend import rewrite_attention_backend

BASE = ["--num-layers", "2", "--transformer-impl", "transformer_engine"]


@pytest.mark.parametrize("value, backend", [("flash", "cpu"), ("fused", "npu"), ("flash", "cuda")])
def test_flash_and_fused_become_use_flash_attn(value, backend):
    for spelling in (["--attention-backend", value], [f"--attention-backend={value}"]):
        out = rewrite_attention_backend(BASE + spelling, backend, te_installed=False)
        assert out.argv == BASE + ["--use-flash-attn"] and not out.refused
        assert out.notes == [f"--attention-backend {value}: FlashAttention (--use-flash-attn) (Transformer Engine's "
                             "attention, which the flag picks among, does not run here)"]
    # already asked for: not twice
    out = rewrite_attention_backend(["--use-flash-attn", "--attention-backend", value], backend, False)
    assert out.argv == ["--use-flash-attn"]


@pytest.mark.parametrize("value", ["unfused", "local"])
def test_unfused_and_local_are_dot_product_attention(value):
    # the flag is dropped: Megatron asserts --spec local for --attention-backend local
    out = rewrite_attention_backend(BASE + ["--attention-backend", value, "--seed", "1"], "cpu", False)
    assert out.argv == BASE + ["--seed", "1"] and not out.refused
    assert "megatron-core's local DotProductAttention" in out.notes[0]
    out = rewrite_attention_backend(["--use-flash-attn", "--attention-backend", value], "cpu", False)
    assert out.refused == [f"--attention-backend {value} asks for megatron-core's local DotProductAttention, "
                           "--use-flash-attn for FlashAttention; drop one of them"]


def test_auto_is_the_backend_default():
    out = rewrite_attention_backend(["--attention-backend", "auto"], "npu", False)
    assert out.argv == [] and out.notes == ["--attention-backend auto: megatron-core's local DotProductAttention, "
                                            "this backend's default"]
    out = rewrite_attention_backend(["--use-flash-attn", "--attention-backend", "auto"], "cpu", False)
    assert out.argv == ["--use-flash-attn"] and "FlashAttention (--use-flash-attn)" in out.notes[0]


def test_transformer_engine_attention_takes_the_flag_unchanged():
    for argv in (BASE + ["--attention-backend", "fused"], ["--attention-backend", "local"]):  # TE is Megatron's default
        out = rewrite_attention_backend(argv, "cuda", te_installed=True)
        assert out.argv == argv and not out.notes and not out.refused
    # --transformer-impl local on the same host: the local spec's kernels, mapped
    out = rewrite_attention_backend(["--transformer-impl", "local", "--attention-backend", "flash"], "cuda", True)
    assert out.argv == ["--transformer-impl", "local", "--use-flash-attn"]


def test_what_flash_attention_cannot_serve_is_refused():
    for extra, why in ((["--window-size", "(8,0)"], "does not support --window-size"),
                       (["--softmax-type", "learnable"], "supports --softmax-type vanilla only, not learnable")):
        out = rewrite_attention_backend(["--attention-backend", "flash", *extra], "cpu", False)
        assert len(out.refused) == 1 and why in out.refused[0] and out.refused[0].startswith("--attention-backend flash")
    assert not rewrite_attention_backend(["--attention-backend", "flash", "--softmax-type", "vanilla"], "cpu",
                                         False).refused
    # DotProductAttention serves a sliding window
    assert not rewrite_attention_backend(["--attention-backend", "unfused", "--window-size", "(8,0)"], "cpu",
                                         False).refused


def test_without_the_flag_or_with_a_bad_value_nothing_changes():
    assert rewrite_attention_backend(BASE, "cpu", False).argv == BASE
    out = rewrite_attention_backend(["--attention-backend", "cudnn"], "cpu", False)  # Megatron's parser refuses it
    assert out.argv == ["--attention-backend", "cudnn"] and not out.notes
