"""The argument side of asynchronous saves and ``--ckpt-format torch_dcp``, in this process.

The runs that save, resume and compare are in tests/e2e/test_async_and_dcp_checkpoints.py.
"""
from __future__ import annotations

import argparse
import importlib.util

import pytest

from adaptor.backend import Backend
from adaptor.features import ArgumentError, FeatureContext
from adaptor.preflight.checkpoint_dirs import check_load_dir
from adaptor.preflight.parallel_layout import check_parallel_layout
from patches.command_line.backend_defaults import BackendDefaults

NVRX_MISSING = importlib.util.find_spec("nvidia_resiliency_ext") is None


def layout(**values) -> argparse.Namespace:
    base = dict(world_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                num_attention_heads=4, group_query_attention=False, num_query_groups=None,
                ckpt_format="torch_dcp", use_torch_fsdp2=True)
    return argparse.Namespace(**{**base, **values})


@pytest.mark.parametrize("values, expected", [
    (dict(use_torch_fsdp2=False), "--ckpt-format torch_dcp is Megatron's checkpoint format for --use-torch-fsdp2; "
                                  "without FSDP2 use --ckpt-format torch_dist or safetensors"),
    (dict(tensor_model_parallel_size=2), "--ckpt-format torch_dcp does not support --tensor-model-parallel-size 2"),
])
def test_torch_dcp_outside_fsdp2_is_one_line(values, expected):
    with pytest.raises(ArgumentError) as caught:
        check_parallel_layout(layout(**values))
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


def test_torch_dcp_with_fsdp2_passes():
    check_parallel_layout(layout())
    check_parallel_layout(layout(ckpt_format="torch_dist", use_torch_fsdp2=False, tensor_model_parallel_size=2))


def test_incomplete_torch_dcp_checkpoint_is_named(tmp_path):
    step = tmp_path / "iter_0000003"
    step.mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    (step / ".metadata").write_bytes(b"x")
    with pytest.raises(ArgumentError, match=r"has no \*\.distcp files; this torch_dcp checkpoint is incomplete"):
        check_load_dir(str(tmp_path), "--load")
    (step / "__0_0.distcp").write_bytes(b"x")
    check_load_dir(str(tmp_path), "--load")


def context(*explicit) -> FeatureContext:
    return FeatureContext(backend=Backend("cpu", "gloo", "test"), flags=argparse.Namespace(), explicit=set(explicit))


@pytest.mark.skipif(not NVRX_MISSING, reason="nvidia-resiliency-ext is installed: Megatron's default strategy runs")
def test_async_save_uses_megatrons_own_writer_without_nvrx(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    args = argparse.Namespace(async_save=True, async_strategy="nvrx")
    BackendDefaults().set_defaults(args, context("async_save"))
    assert args.async_strategy == "mcore"
    said = capsys.readouterr().out
    assert "async_strategy=mcore (for --async-save: the default nvrx needs nvidia-resiliency-ext" in said
    BackendDefaults().validate(args, context("async_save"))

    quiet = argparse.Namespace(async_save=False, async_strategy="nvrx")  # Megatron sets mcore itself then
    BackendDefaults().set_defaults(quiet, context())
    assert quiet.async_strategy == "nvrx"

    chosen = argparse.Namespace(async_save=True, async_strategy="nvrx")
    BackendDefaults().set_defaults(chosen, context("async_save", "async_strategy"))
    assert chosen.async_strategy == "nvrx"
    with pytest.raises(ArgumentError) as caught:
        BackendDefaults().validate(chosen, context("async_save", "async_strategy"))
    assert str(caught.value) == ("--async-strategy nvrx needs nvidia-resiliency-ext, which is not installed; install "
                                 "it or pass --async-strategy mcore (Megatron's own checkpoint worker)")


def test_async_save_of_the_torch_format_is_one_line():
    args = argparse.Namespace(async_save=True, async_strategy="mcore", ckpt_format="torch", save="ckpt")
    with pytest.raises(ArgumentError, match=r"^--async-save is not implemented by Megatron for --ckpt-format torch; "):
        BackendDefaults().validate(args, context("async_save", "async_strategy"))
    BackendDefaults().validate(argparse.Namespace(async_save=True, async_strategy="mcore", ckpt_format="torch_dist",
                                                  save="ckpt"), context("async_save", "async_strategy"))
