"""Save and load throughput of --ckpt-format safetensors against Megatron's torch_dist, and the raw disk.

    python benchmarks/checkpoint_throughput.py --work-dir /tmp/ckpt_bench

A Qwen3-0.6B-shaped model (28 layers, hidden 1024, 16 heads / 8 groups of 128, ffn 3072,
vocabulary 151936, tied; 0.6 B parameters, 2.4 GB of fp32 weights) trains one iteration on
mock data and saves model + Adam state (about 7.2 GB); a second run loads it. The times are
Megatron's own ``save-checkpoint`` / ``load-checkpoint`` timers (everything from building the
sharded state dict to the last file, and to the last tensor in the model and optimizer), the
bytes are what the checkpoint directory holds. The raw disk figures are one file of the same size
written with ``write`` + ``fsync`` (and read back) on the same filesystem, before and after the
formats run (the disk's speed drifts between them).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.megatron_runs import TORCHRUN, free_port  # noqa: E402

QWEN3_06B = [
    "--num-layers", "28", "--hidden-size", "1024", "--ffn-hidden-size", "3072", "--num-attention-heads", "16",
    "--group-query-attention", "--num-query-groups", "8", "--kv-channels", "128", "--qk-layernorm",
    "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
    "--rotary-base", "1000000", "--seq-length", "64", "--max-position-embeddings", "64",
    "--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "1e-4", "--train-iters", "1",
    "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000", "--mock-data",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "151935", "--seed", "1",
]
_TIMER = r"{name} \.+: \(([0-9.]+), ([0-9.]+)\)"


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def run(args: list[str], nproc: int) -> str:
    cmd = TORCHRUN + [f"--nproc_per_node={nproc}", f"--master_port={free_port()}", str(ROOT / "pretrain_gpt.py"), *args]
    env = dict(os.environ, ADAPTOR_BACKEND=os.environ.get("ADAPTOR_BACKEND", "cpu"), ADAPTOR_QUIET="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit("\n".join(out.splitlines()[-30:]))
    return out


def timer_seconds(out: str, name: str) -> float:
    match = re.search(_TIMER.format(name=name), out)
    if match is None:
        sys.exit(f"no {name} timer in the output")
    return float(match.group(2)) / 1000  # the slowest rank


def drop_page_cache() -> bool:
    """Loads then read from the disk, not from memory (needs root; skipped otherwise)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def reader_only(checkpoint: Path) -> float:
    """GB/s of our reader alone: every saved shard read back (cold page cache), no Megatron around it."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("ADAPTOR_QUIET", "1")
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from adaptor.checkpoint.object_codec import dtype_from_name
    from adaptor.checkpoint.reader import CheckpointIndex

    iteration = (checkpoint / "latest_checkpointed_iteration.txt").read_text().strip()
    index = CheckpointIndex(checkpoint / f"iter_{int(iteration):07d}")
    drop_page_cache()
    start, total = time.perf_counter(), 0
    for key, shards in index.shards.items():
        for s in shards:
            if s.flattened_range is not None:
                continue
            request = ShardedTensor(key, None, dtype_from_name(s.dtype), s.local_shape, s.global_shape,
                                    s.global_offset, None, prepend_axis_num=s.prepend_axis_num)
            total += index.load_tensor(request).nbytes
    return total / (time.perf_counter() - start) / 1e9


def raw_disk(directory: Path, nbytes: int) -> tuple[float, float]:
    """GB/s of writing (write + fsync) and reading back one file of ``nbytes``."""
    path = directory / "raw.bin"
    block = os.urandom(64 << 20)
    start = time.perf_counter()
    with open(path, "wb") as out:
        written = 0
        while written < nbytes:
            out.write(block)
            written += len(block)
        out.flush()
        os.fsync(out.fileno())
    write = written / (time.perf_counter() - start) / 1e9
    drop_page_cache()
    start = time.perf_counter()
    buffer = bytearray(64 << 20)
    with open(path, "rb", buffering=0) as src:
        while src.readinto(buffer):
            pass
    read = written / (time.perf_counter() - start) / 1e9
    path.unlink()
    return write, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--formats", nargs="+", default=["safetensors", "torch_dist"])
    parser.add_argument("--repeat", type=int, default=2, help="save+load rounds per format, alternating formats")
    opts = parser.parse_args()
    work = Path(opts.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows, raw = [], []
    size_guess = 7_150_000_000
    raw.append(raw_disk(work, size_guess))  # before and after the formats: the disk's speed drifts
    cold = False
    for _ in range(opts.repeat):
        for fmt in opts.formats:
            save = work / fmt
            out = run(QWEN3_06B + ["--save", str(save), "--save-interval", "1", "--ckpt-format", fmt], opts.nproc)
            size = du(save)
            save_s = timer_seconds(out, "save-checkpoint")
            cold = drop_page_cache()
            out = run(QWEN3_06B + ["--load", str(save), "--ckpt-format", fmt], opts.nproc)
            load_s = timer_seconds(out, "load-checkpoint")
            rows.append((fmt, size, save_s, load_s))
            if fmt == "safetensors":
                print(f"safetensors reader alone (cold page cache): {reader_only(save):.2f} GB/s", flush=True)
            print(f"{fmt}: {size / 1e9:.2f} GB, save {save_s:.1f} s = {size / save_s / 1e9:.2f} GB/s, "
                  f"load {load_s:.1f} s = {size / load_s / 1e9:.2f} GB/s ({'cold' if cold else 'warm'} page cache)",
                  flush=True)
            shutil.rmtree(save)
    raw.append(raw_disk(work, max(size for _, size, _, _ in rows)))
    for when, (write, read) in zip(("before", "after"), raw):
        print(f"raw disk {when}: write+fsync {write:.2f} GB/s, read {read:.2f} GB/s (same filesystem, about the same size)")
    print("\n| format | checkpoint GB | save s (median) | save GB/s | load s (median) | load GB/s |\n"
          "|---|---|---|---|---|---|")
    for fmt in opts.formats:
        mine = [r for r in rows if r[0] == fmt]
        size = mine[0][1]
        save_s = sorted(r[2] for r in mine)[len(mine) // 2]
        load_s = sorted(r[3] for r in mine)[len(mine) // 2]
        print(f"| {fmt} | {size / 1e9:.2f} | {save_s:.1f} | {size / save_s / 1e9:.2f} | {load_s:.1f} | "
              f"{size / load_s / 1e9:.2f} |")
    for when, (write, read) in zip(("before", "after"), raw):
        print(f"| raw disk {when} (write+fsync / read) | {max(r[1] for r in rows) / 1e9:.2f} | | {write:.2f} | | "
              f"{read:.2f} |")


if __name__ == "__main__":
    main()
