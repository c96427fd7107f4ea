"""tools/safetensors_ckpt.py as a user starts it: info, and merge's and split's input errors, without torch;
and the one line a failed re-save at a layout is reported by.

Each case runs the tool in a fresh interpreter under ``-X importtime``, so every module it imported is
on record: torch (seconds to import) must not be among them. The checkpoint is the shared tiny
DeepSeek-V3 converted to a safetensors checkpoint (stacked layers and experts: keys with prepended axes).
A merge of a damaged checkpoint: tests/e2e/test_preflight.py.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from adaptor.convert import Layout, convert_hf_to_megatron
from helpers.one_line_errors import base_env
from helpers.paths import TOOLS

PROG = "safetensors_ckpt.py"
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)


def run_tool(cwd, *args) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The tool's run (stderr without the import records) and the modules it imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(TOOLS / PROG), *map(str, args)], cwd=cwd,
                          env=base_env(), capture_output=True, text=True, timeout=120, check=False)
    imported = set(IMPORTED.findall(proc.stderr))
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    return proc, imported


@pytest.fixture(scope="module")
def checkpoint(hf_models, tmp_path_factory):
    save = tmp_path_factory.mktemp("safetensors_ckpt") / "mg"
    convert_hf_to_megatron(hf_models["deepseek3"], save, "deepseek3", Layout(), save_format="safetensors")
    return save


def test_info_reads_the_shard_table_without_torch(checkpoint, tmp_path):
    from adaptor.checkpoint.consolidated import GlobalTensors

    proc, imported = run_tool(tmp_path, "info", "--load-dir", checkpoint)
    assert proc.returncode == 0, proc.stderr
    assert "torch" not in imported and "megatron" not in imported, "info imported torch or Megatron"
    whole = GlobalTensors(checkpoint, model_only=False)  # the tensors merge would assemble, sized by torch
    metas = [whole.meta(name) for name in whole.tensors]
    model = sum(not t.key.startswith("optimizer.") for t in whole.tensors.values())
    size = sum(m.numel() * m.element_size() for m in metas)
    doc = whole.index.doc
    assert proc.stdout == (f"{checkpoint / 'release'}: iteration {doc['iteration']}, world size {doc['world_size']}, "
                           f"layout {doc.get('parallel')}, 1 rank files, {model} model tensors, "
                           f"{len(metas) - model} optimizer tensors, {size / 1e9:.3f} GB of tensors\n")
    assert any(name.startswith("decoder.layers.3.mlp.experts.local_experts.1.") for name in whole.tensors)


@pytest.mark.parametrize("case", ["missing --load-dir", "non-empty --save-dir", "bad --max-shard-size",
                                  "split of an unmerged directory"])
def test_input_errors_come_before_torch(checkpoint, tmp_path, case):
    out = tmp_path / "out"
    full = tmp_path / "full"
    full.mkdir()
    (full / "kept").write_text("")
    argv, text = {
        "missing --load-dir": (["merge", "--load-dir", tmp_path / "nothere", "--save-dir", out],
                               "nothere: neither a safetensors checkpoint nor a --save directory"),
        "non-empty --save-dir": (["merge", "--load-dir", checkpoint, "--save-dir", full],
                                 f"--save-dir {full} exists and is not empty"),
        "bad --max-shard-size": (["merge", "--load-dir", checkpoint, "--save-dir", out, "--max-shard-size", "5XB"],
                                 "--max-shard-size '5XB': use a size like 5GB or 500MB"),
        "split of an unmerged directory": (["split", "--load-dir", checkpoint, "--save-dir", out,
                                            "--tensor-model-parallel-size", "2"],
                                           "megatron_checkpoint.json: missing (not a directory written by"),
    }[case]
    proc, imported = run_tool(tmp_path, *argv)
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"{PROG}: error:")]
    assert proc.returncode == 2 and len(lines) == 1 and text in lines[0], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "torch" not in imported, "the error came after torch was imported"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"] and [p.name for p in full.iterdir()] == ["kept"]


@pytest.mark.parametrize("output, reason", [
    ("usage: pretrain_gpt.py [-h]\npretrain_gpt.py: error: argument --num-layers: invalid int value: 'x'\n",
     "pretrain_gpt.py: error: argument --num-layers: invalid int value: 'x'"),
    ("[rank1]: megatron-adaptor: error: --hidden-size 63 is not divisible\nTraceback (most recent call last):\n"
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
     "megatron-adaptor: error: --hidden-size 63 is not divisible"),
    ("  error_injection_type ...... transient_error\n[rank0]: Traceback (most recent call last):\n"
     "[rank0]: Exception: either train-iters or train-samples should be provided.\nTraceback (most recent call last):\n"
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n=====\n",
     "Exception: either train-iters or train-samples should be provided."),
    ("", "no output"),
])
def test_a_failed_resave_is_reported_by_the_child_reason(output, reason):
    """split at a layout names the re-saving run's own error, not torchrun's summary of it."""
    from helpers.processes import import_tool

    assert import_tool("safetensors_ckpt").child_reason(output) == reason
