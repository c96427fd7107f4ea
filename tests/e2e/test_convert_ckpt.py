"""tools/convert_ckpt.py and adaptor.convert against Megatron itself: its own checkpoints and --load runs.

Reference points that do not come from the converter itself: transformers' save_pretrained
output (tests/helpers/hf_fixtures.py), checkpoints Megatron saves itself at the same layout
(names, shapes, file names), pretrain_gpt.py --load runs, and the converter's real command line.
In-process conversions and their bad input: tests/unit/test_convert_ckpt.py.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from adaptor.convert import (
    HfCheckpoint, Layout, convert_hf_to_megatron, convert_megatron_to_hf, megatron_args_from_hf_config,
)
from helpers.megatron_runs import TINY_DEEPSEEK_V3, TINY_QWEN3, run_pretrain, side_by_side, tail
from helpers.processes import run_tool


def model_type(key: str) -> str:
    return "deepseek3" if key.startswith("deepseek") else "qwen3"


def load_rank(path):
    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)["model"]


# Megatron's own checkpoints at the same layout: converted files must have the same names and shapes
# (DeepSeek-V3 at PP2, MTP and embedding on the last stage, is covered by the strict --load below).
REAL_LAYOUTS = [
    ("qwen3_tied", TINY_QWEN3, 4, Layout(2, 2), ["--tensor-model-parallel-size", "2",
                                                 "--pipeline-model-parallel-size", "2"]),
    ("deepseek3", TINY_DEEPSEEK_V3, 2, Layout(2, 1, 2, etp=1),
     ["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
      "--expert-tensor-parallel-size", "1", "--sequence-parallel"]),
]


@pytest.mark.parametrize("key,flags,nproc,layout,parallel", REAL_LAYOUTS, ids=["qwen3-tp2pp2", "ds3-tp2ep2"])
def test_rank_files_match_megatrons_own_checkpoint(hf_models, tmp_path, key, flags, nproc, layout, parallel):
    saved = tmp_path / "megatron"
    run = run_pretrain(flags + parallel + ["--train-iters", "1", "--save", str(saved), "--save-interval", "1",
                                           "--ckpt-format", "torch"], nproc=nproc)
    assert run.returncode == 0, tail(run.output)
    convert_hf_to_megatron(hf_models[key], tmp_path / "converted", model_type(key), layout, save_format="torch")
    real_files = sorted((saved / "iter_0000001").glob("mp_rank_*/model_optim_rng.pt"))
    assert len(real_files) == nproc
    for real in real_files:
        ours = tmp_path / "converted" / "release" / real.parent.name / real.name
        assert ours.is_file(), ours
        shapes = lambda sd: {k: None if v is None else tuple(v.shape) for k, v in sd.items()}  # noqa: E731
        assert shapes(load_rank(ours)) == shapes(torch.load(real, mmap=True, weights_only=False)["model"])


TRAIN = ["--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
         "--train-iters", "1", "--seed", "1234", "--log-interval", "1", "--eval-iters", "0",
         "--eval-interval", "100000", "--attention-dropout", "0", "--hidden-dropout", "0",
         "--mock-data", "--tokenizer-type", "NullTokenizer"]
LOAD_LAYOUTS = {
    # model: (training flags beyond the architecture, the parallel layout compared with TP1)
    "qwen3_tied": ([], Layout(tp=2), ["--tensor-model-parallel-size", "2"]),
    "deepseek3": (["--moe-token-dispatcher-type", "alltoall", "--mtp-loss-scaling-factor", "0.1"], Layout(pp=2),
                  ["--pipeline-model-parallel-size", "2"]),
}


@pytest.mark.parametrize("key,save_format", [("qwen3_tied", "safetensors"), ("qwen3_tied", "torch"),
                                             ("deepseek3", "safetensors"), ("deepseek3", "torch")])
def test_pretrain_loads_converted_checkpoint_same_loss_as_single_process(hf_models, tmp_path, key, save_format):
    """pretrain_gpt.py --load DIR --ckpt-format torch (as MindSpeed-LLM's scripts pass it), model flags from
    megatron_args_from_hf_config.

    The safetensors release (the default) is one file of whole tensors whatever the target layout,
    resharded on load; it loads under --ckpt-format torch too."""
    config = json.loads((hf_models[key] / "config.json").read_text())
    extra, layout, parallel = LOAD_LAYOUTS[key]
    flags = megatron_args_from_hf_config(model_type(key), config) + TRAIN + extra

    jobs = {}
    for name, lay, par in (("single", Layout(), []), ("parallel", layout, parallel)):
        ckpt = tmp_path / name
        convert_hf_to_megatron(hf_models[key], ckpt, model_type(key), lay, save_format=save_format)
        assert (ckpt / "release" / "metadata.json").is_file() == (save_format == "safetensors")
        args, nproc = flags + par + ["--load", str(ckpt), "--ckpt-format", "torch"], lay.tp * lay.pp * lay.ep
        jobs[name] = lambda args=args, nproc=nproc: run_pretrain(args, nproc=nproc)

    # qwen3_tied also trains from a fresh init (one process); the two one-process runs go one after the other
    fresh_run = key == "qwen3_tied" and save_format == "safetensors"
    single_then_fresh = lambda: (jobs["single"](), run_pretrain(flags) if fresh_run else None)  # noqa: E731
    (single, fresh), parallel_run = side_by_side(single_then_fresh, jobs["parallel"])
    runs = {"single": single, "parallel": parallel_run}
    for run in runs.values():
        assert run.returncode == 0, tail(run.output)
        assert "successfully loaded checkpoint" in run.output
        # Megatron retries a failed strict load non-strictly and prints load_return: names and shapes must match.
        assert "load_return" not in run.output, tail(run.output)
    # fp32 on CPU; TP/PP change only the order of partial sums: agreement to 1e-4 relative.
    assert runs["parallel"].losses[1] == pytest.approx(runs["single"].losses[1], rel=1e-4)
    if runs["single"].mtp_losses:
        assert runs["parallel"].mtp_losses[1] == pytest.approx(runs["single"].mtp_losses[1], rel=1e-4)
    if fresh is not None:
        assert fresh.returncode == 0, tail(fresh.output)
        assert abs(runs["single"].losses[1] - fresh.losses[1]) > 1e-3  # the loaded weights, not a fresh init


def test_virtual_pipeline_stages_match_megatrons_own_checkpoint(hf_models, tmp_path):
    """PP2 x VPP2 (--num-layers-per-virtual-pipeline-stage 1 of 4 layers), tied: one run at lr 0 loads the
    safetensors release (converted without virtual stages: it has no layout) and saves Megatron's own rank files
    (--ckpt-format torch) and --hf-save-dir. The offline conversion's torch rank files at PP2 x VPP2 hold what
    Megatron's do, chunk by chunk ("model0", "model1": names, shapes and values, the loaded weights unchanged at
    lr 0); --hf-save-dir, and tools/convert_ckpt.py's mg -> hf of Megatron's own files, give back the source
    tensors bit for bit. (--hf-load-dir at this layout: tests/e2e/test_hf_parity.py.)"""
    src = hf_models["qwen3_tied"]
    release = convert_hf_to_megatron(src, tmp_path / "release", "qwen3", Layout())
    flags = megatron_args_from_hf_config("qwen3", json.loads((src / "config.json").read_text())) + TRAIN
    run = run_pretrain(flags + ["--lr", "0", "--pipeline-model-parallel-size", "2",
                                "--num-layers-per-virtual-pipeline-stage", "1", "--load", str(release),
                                "--model-type-hf", "qwen3", "--hf-save-dir", str(tmp_path / "hf_out"),
                                "--save", str(tmp_path / "megatron"), "--save-interval", "1", "--ckpt-format", "torch"],
                       nproc=2)
    assert run.returncode == 0, tail(run.output)
    assert "successfully loaded checkpoint" in run.output and "load_return" not in run.output, tail(run.output)
    convert_hf_to_megatron(src, tmp_path / "converted", "qwen3", Layout(1, 2, vpp=2), save_format="torch")
    real_files = sorted((tmp_path / "megatron" / "iter_0000001").glob("mp_rank_*/model_optim_rng.pt"))
    assert [f.parent.name for f in real_files] == ["mp_rank_00_000", "mp_rank_00_001"]
    for real in real_files:
        theirs = torch.load(real, map_location="cpu", weights_only=False)
        ours = torch.load(tmp_path / "converted" / "release" / real.parent.name / real.name, weights_only=True)
        chunks = sorted(k for k in theirs if k.startswith("model"))
        assert chunks == ["model0", "model1"] and sorted(k for k in ours if k.startswith("model")) == chunks
        for chunk in chunks:
            assert sorted(ours[chunk]) == sorted(theirs[chunk]), (real, chunk)
            for name, tensor in ours[chunk].items():
                if tensor is not None:
                    assert torch.equal(tensor, theirs[chunk][name]), (real.parent.name, chunk, name)
    # --hf-save-dir, and mg -> hf of Megatron's own checkpoint (its layout read from the saved args)
    convert_megatron_to_hf(tmp_path / "megatron", tmp_path / "hf_back", "qwen3", hf_config_dir=src)
    before = HfCheckpoint(src)
    for out in ("hf_out", "hf_back"):
        after = HfCheckpoint(tmp_path / out)
        assert sorted(after.names()) == sorted(before.names())
        assert all(torch.equal(before.get(n), after.get(n)) for n in before.names()), out


def test_missing_megatron_rank_file_via_command_line(hf_models, tmp_path):
    """The real command line: exit status 2, one stderr line naming the file, no HF directory left."""
    mg = convert_hf_to_megatron(hf_models["qwen3_tied"], tmp_path / "mg", "qwen3", Layout(tp=2), save_format="torch")
    (mg / "release" / "mp_rank_01" / "model_optim_rng.pt").unlink()
    proc = run_tool("convert_ckpt.py", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", mg,
                    "--save-dir", tmp_path / "hf", env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == [f"convert_ckpt.py: error: {mg}/release/mp_rank_01/model_optim_rng.pt: "
                      f"missing Megatron checkpoint file"], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mg"]
