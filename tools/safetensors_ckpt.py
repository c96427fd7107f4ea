#!/usr/bin/env python
"""Merge a sharded safetensors checkpoint into whole tensors, split one into a parallel layout, or describe one.

    python tools/safetensors_ckpt.py merge --load-dir ckpt --save-dir merged            # Megatron names
    python tools/safetensors_ckpt.py merge --load-dir ckpt --save-dir hf --model-type-hf qwen3
    python tools/safetensors_ckpt.py split --load-dir merged --save-dir ckpt-tp2 --tensor-model-parallel-size 2
    python tools/safetensors_ckpt.py info --load-dir ckpt

merge writes ``model-0000x-of-0000N.safetensors`` + ``model.safetensors.index.json`` (or one
``model.safetensors`` within --max-shard-size) and ``megatron_checkpoint.json``; --model-type-hf gives
HF names and config.json. split makes a Megatron-named merged directory a ``--load``-able checkpoint:
a release checkpoint any layout reshards, or with layout flags one Megatron re-saves
(``--ckpt-convert-format``, replaying the recorded command line). Writes are staged and renamed. info,
and merge/split's directory checks, run before importing torch.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if __name__ == "__main__":
    warnings.filterwarnings("ignore")
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

PROG = "safetensors_ckpt.py"
# Flags of the recorded command line that split replaces (value-taking or not, per Megatron's parser).
REPLACED = {"--save", "--load", "--save-interval", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
            "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-layers-per-virtual-pipeline-stage",
            "--async-save", "--keep-checkpoint-max", "--exit-signal-handler", "--exit-interval", "--exit-duration-in-mins",
            "--ckpt-format", "--hf-load-dir", "--hf-save-dir", "--pretrained-checkpoint", "--finetune",
            "--use-persistent-ckpt-worker", "--sequence-parallel", "--data-path", "--split", "--train-data-path",
            "--valid-data-path", "--test-data-path", "--data-cache-path", "--mock-data", "--use-checkpoint-args"}


def parse_size(text: str) -> int:
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit) and upper[:-len(unit)].strip().replace(".", "", 1).isdigit():
            return int(float(upper[:-len(unit)]) * factor)
    if upper.isdigit():
        return int(upper)
    raise ValueError(text)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="whole tensors, Megatron or Hugging Face names")
    merge.add_argument("--load-dir", required=True, help="a --save directory (its latest checkpoint) or an iter_* directory")
    merge.add_argument("--save-dir", required=True)
    merge.add_argument("--model-type-hf", choices=["qwen3", "deepseek3", "llama2", "qwen2", "qwen3-moe", "mixtral"],
                       help="write Hugging Face names and config.json")
    merge.add_argument("--max-shard-size", default="5GB")
    split = sub.add_parser("split", help="a merged directory back into a checkpoint, at a layout if given")
    split.add_argument("--load-dir", required=True)
    split.add_argument("--save-dir", required=True)
    split.add_argument("--tensor-model-parallel-size", type=int)
    split.add_argument("--pipeline-model-parallel-size", type=int)
    split.add_argument("--expert-model-parallel-size", type=int)
    info = sub.add_parser("info", help="iteration, layout, files and tensors of a checkpoint")
    info.add_argument("--load-dir", required=True)
    args = parser.parse_args(argv)
    if args.command == "merge":
        try:
            args.max_shard_bytes = parse_size(args.max_shard_size)
        except ValueError:
            parser.error(f"--max-shard-size {args.max_shard_size!r}: use a size like 5GB or 500MB")
    if args.command == "split":
        for flag in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    return args


def replay_argv(recorded: list[str], layout: dict[str, int], load: Path, out: Path) -> list[str]:
    """The recorded pretrain command line, re-aimed: the new layout, loading ``load``, converting into ``out``."""
    from megatron.training.arguments import add_megatron_arguments

    from adaptor.bootstrap import all_features

    parser = all_features().add_arguments(add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)))
    takes = {opt: action.nargs for action in parser._actions for opt in action.option_strings}
    kept, tokens, i = [], list(recorded), 0
    while i < len(tokens):
        token = tokens[i]
        flag = token.split("=", 1)[0]
        nargs = takes.get(flag)
        count = 0 if "=" in token or nargs == 0 else 1 if nargs is None else None
        end = i + 1
        if count is None:  # nargs '+', '*' or a number: values up to the next option
            while end < len(tokens) and not tokens[end].startswith("--"):
                end += 1
        else:
            end += count
        if flag not in REPLACED:
            kept += tokens[i:end]
        i = end
    tp = layout.get("tensor_model_parallel_size", 1)
    sequence_parallel = "--sequence-parallel" in recorded and tp > 1
    return kept + [
        "--tensor-model-parallel-size", str(tp),
        "--pipeline-model-parallel-size", str(layout.get("pipeline_model_parallel_size", 1)),
        "--expert-model-parallel-size", str(layout.get("expert_model_parallel_size", 1)),
        *(["--sequence-parallel"] if sequence_parallel else []),
        "--mock-data", "--load", str(load), "--ckpt-format", "safetensors", "--no-load-optim", "--no-load-rng",
        "--ckpt-convert-format", "safetensors", "--ckpt-convert-save", str(out), "--no-save-optim", "--no-save-rng",
    ]


def check_inputs(args) -> dict | None:
    """merge's and split's errors in --load-dir and --save-dir, found before they import torch.

    Returns what split reads from its --load-dir: the merged directory's description.
    """
    from adaptor.checkpoint.errors import CheckpointError
    from adaptor.checkpoint.files import refuse_nonempty
    from adaptor.checkpoint.consolidated_dirs import SIDE_FILE, read_side_file, resolve

    side = None
    if args.command == "merge":
        resolve(args.load_dir)
    else:
        side = read_side_file(args.load_dir)
        if layout_of(args) and not side.get("command_line"):
            raise CheckpointError(f"{Path(args.load_dir) / SIDE_FILE}: records no training command line to replay "
                                  f"at a layout; split without layout flags and load that at the layout instead")
    refuse_nonempty(Path(args.save_dir))
    return side


def layout_of(args) -> dict[str, int]:
    return {k: getattr(args, k) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                          "expert_model_parallel_size") if getattr(args, k)}


# The re-saving run's own reason, whichever rank printed it ("[rank1]: " prefixed once its process
# group exists): a one-line error (ours, or an argument parser's "<prog>: error:"), else the first
# exception a rank raised; torchrun's ChildFailedError, printed last, only says that a rank failed.
_RANK = r"^(?:\[rank\d+\]:\s*)?"
_ERROR_LINE = re.compile(_RANK + r"((?:megatron-adaptor|\S+\.py): error: .*)$")
_EXCEPTION_LINE = re.compile(_RANK + r"((?!\S*ChildFailedError)(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit): .*)$")


def child_reason(output: str) -> str:
    """Why the re-saving run failed, in one line of its output."""
    lines = output.splitlines()
    for pattern in (_ERROR_LINE, _EXCEPTION_LINE):
        found = next((m.group(1) for m in map(pattern.match, lines) if m), None)
        if found:
            return found
    return next((line for line in reversed(lines) if line.strip()), "no output")


def split(args, side: dict) -> Path:
    from adaptor.checkpoint.errors import CheckpointError
    from adaptor.checkpoint.files import staged_directory
    from adaptor.checkpoint.consolidated import to_release

    layout = layout_of(args)
    save_dir = Path(args.save_dir)
    if not layout:
        return to_release(args.load_dir, save_dir)
    recorded = side["command_line"]
    work = save_dir.with_name(f".{save_dir.name}.split")
    shutil.rmtree(work, ignore_errors=True)
    try:
        release = to_release(args.load_dir, work / "release")
        nproc = layout.get("tensor_model_parallel_size", 1) * layout.get("pipeline_model_parallel_size", 1) \
            * layout.get("expert_model_parallel_size", 1)
        script = Path(recorded[0]) if Path(recorded[0]).is_file() else ROOT / "pretrain_gpt.py"
        from adaptor.env import torchrun_command
        from adaptor.rendezvous import rendezvous_port

        cmd = [*torchrun_command(), f"--nproc_per_node={nproc}", "--master_port",
               os.environ.get("MASTER_PORT") or str(rendezvous_port()), str(script),
               *replay_argv(recorded[1:], layout, release, work / "converted")]
        env = dict(os.environ, ADAPTOR_QUIET="1")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not (work / "converted" / "safetensors").is_dir():
            reason = child_reason(proc.stdout + proc.stderr)
            raise CheckpointError(f"re-saving at {layout} failed (exit {proc.returncode}): {reason}")
        with staged_directory(save_dir) as temp:  # refused again if filled during the re-save
            for entry in (work / "converted" / "safetensors").iterdir():
                entry.rename(temp / entry.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return save_dir


def merge(args) -> Path:
    """Megatron names (adaptor.checkpoint), or Hugging Face names (the conversion library, which imports torch)."""
    from adaptor.checkpoint.errors import CheckpointError

    if not args.model_type_hf:
        from adaptor.checkpoint.consolidated import merge as merge_megatron_names

        return merge_megatron_names(args.load_dir, args.save_dir, args.max_shard_bytes)
    from adaptor.convert.errors import ConversionError
    from adaptor.convert.offline import merge_to_hf

    try:
        return merge_to_hf(args.load_dir, args.save_dir, args.model_type_hf, args.max_shard_bytes)
    except ConversionError as exc:
        raise CheckpointError(str(exc)) from None


def info(args) -> str:
    """One line from the shard table alone: no torch, no tensor data read."""
    from adaptor.checkpoint.global_names import global_tensors
    from adaptor.checkpoint.shard_table import ShardTable
    from adaptor.checkpoint.consolidated_dirs import resolve

    table = ShardTable(resolve(args.load_dir))
    tensors = list(global_tensors(table.shards, model_only=False).values())
    doc = table.doc
    size = sum(t.nbytes for t in tensors)
    model = [t for t in tensors if not t.key.startswith("optimizer.")]
    return (f"{table.dir}: iteration {doc.get('iteration')}, world size {doc.get('world_size')}, "
            f"layout {doc.get('parallel')}, {len(doc.get('files', []))} rank files, "
            f"{len(model)} model tensors, {len(tensors) - len(model)} optimizer tensors, "
            f"{size / 1e9:.3f} GB of tensors")


def main(argv=None) -> int:
    args = parse_args(argv)
    from adaptor.checkpoint.errors import CheckpointError

    try:
        if args.command == "info":
            print(info(args))
            return 0
        side = check_inputs(args)
        if args.command == "merge":
            out = merge(args)
            print(f"[{PROG}] merged {args.load_dir} into {out}")
        else:
            out = split(args, side)
            print(f"[{PROG}] split {args.load_dir} into {out}")
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
