"""Per-rank memory and step time of context parallelism (ring, Ulysses) and of packed documents.

    python benchmarks/context_parallel.py [--lengths 4096 16384 32768] [--iters N] [--warmup 1]
                                          [--only cp packed] [--timeout 3600] [--out /tmp/context_parallel_bench.json]

Every row is one `torchrun --nproc_per_node N` run of pretrain_gpt.py (its own `main()`, started
through this file's `--worker`, see Memory) with the tiny Qwen3 of the tests
(`tests/helpers/megatron_runs.py` TINY_QWEN3_MODEL: 4 layers, hidden 64, 4 heads in 2 query groups
of 32, vocabulary 512), fp32, micro-batch 1 and global batch 1 (so DP = 1 and the CP ranks hold the
two halves of the same sequence), `--attention-dropout 0`, ADAPTOR_BACKEND=cpu,
ADAPTOR_REPORT_MEMORY=1, OMP_NUM_THREADS=1 per process (`--threads` changes it): so a CP=1 run
computes on one core and a CP=2 run on two.

(A) context parallelism on mock data, per `--lengths` (--seq-length = --max-position-embeddings):
    CP=1 (one process, `--use-flash-attn --no-create-attention-mask-in-dataloader`: the adaptor's
    flash attention, no [s, s] mask anywhere, so that the rows differ in attention only), CP=2 ring
    (`--context-parallel-size 2 --cp-comm-type p2p`) and CP=2 Ulysses (`--cp-comm-type a2a`); CP turns
    the dataloader's mask off by itself.
(B) packed documents at 8192: an indexed dataset written here (megatron-core's IndexedDatasetBuilder,
    as tests/helpers/datasets.py) whose documents are 1023 random tokens and the NullTokenizer's EOD
    (vocabulary - 1 = 511), 1024 tokens each. GPTDataset cuts sample i at tokens [8192 i, 8192 (i+1)]
    and all documents have the same length, so every sequence is exactly 8 whole documents, and
    `--reset-attention-mask` cuts it 8 ways. "dense mask": `--reset-attention-mask` alone, CP = 1:
    the dataloader builds the [1, s, s] mask and megatron-core's DotProductAttention applies it.
    "packed": `--reset-attention-mask --use-flash-attn`: the batch reaches attention as 8 documents
    (THD, one flash call per document) and the dataloader builds no mask.

Step time: the median of Megatron's "elapsed time per iteration (ms)" (--log-interval 1) over the
iterations after `--warmup`.

Memory, per rank, as Linux counts it (VmHWM / ru_maxrss; CPU tensors are plain malloc memory, so the
resident set follows the live tensors). Each rank runs pretrain_gpt.py's own `main()` through this
file (`--worker`), which wraps `forward_step`: at the first call (the start of the first training
step: model, gradient buffers, dataloader and the whole runtime already exist) it reads the resident
set and resets the high-water mark (`echo 5 > /proc/self/clear_refs`), and after training it reads
the high-water mark again. So each rank reports
  * peak RSS: the larger of the two high-water marks (the process's whole peak);
  * RSS at the first step: the fixed baseline (Python, torch, Megatron, model, optimizer, data);
  * activation = peak during training - RSS at the first step: what the steps add: activations,
    the logits and loss, attention's temporaries and communication buffers, gradients of the
    activations, and (a few MiB for this model) Adam's state, created at the first step.
This was preferred to peak(seq) - peak(short reference run): it needs no extra runs, does not
subtract the reference length's own activations, is not hidden by a start-up peak above the
training peak at short lengths, and subtracts the baseline's drift with the length (tens of MiB
here; not traced) instead of counting it as activation. ADAPTOR_REPORT_MEMORY's
"peak memory" line (ru_maxrss) is printed after the reset, so it is the training peak too: the JSON
keeps it beside ours as a cross-check. The dataloader's worker processes (--num-workers 2) are not
counted in a rank's memory.

A run that fails, is killed (e.g. out of memory) or passes `--timeout` is reported as such, with the
iterations it did log. Load averages at the start and the end of each run go to the JSON file.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date, datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_TAG = "[context-parallel-bench]"


# ------------------------------------------------------------------------------------ worker (one rank)
def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def worker(argv: list[str]) -> None:
    """Run pretrain_gpt.py's main() with `argv`, measuring RSS at the first step and the peaks around it."""
    sys.argv = [str(ROOT / "pretrain_gpt.py"), *argv]
    sys.path.insert(0, str(ROOT))
    import pretrain_gpt  # imports adaptor first, as the script does

    inner = pretrain_gpt.forward_step
    marks: dict[str, int] = {}

    @functools.wraps(inner)
    def forward_step(*args, **kwargs):
        if not marks:
            marks["hwm_before_kib"] = _status_kib("VmHWM")
            marks["rss_first_step_kib"] = _status_kib("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM (and ru_maxrss) to the current RSS
        return inner(*args, **kwargs)

    pretrain_gpt.forward_step = forward_step  # main() looks the name up when it runs
    pretrain_gpt.main()
    hwm_train = _status_kib("VmHWM")
    rank = os.environ.get("RANK", "0")
    print(f"{BENCH_TAG} rank {rank}: startup peak {marks['hwm_before_kib'] / 1024:.1f} MiB, "
          f"first step RSS {marks['rss_first_step_kib'] / 1024:.1f} MiB, "
          f"training peak {hwm_train / 1024:.1f} MiB", flush=True)


# ------------------------------------------------------------------------------------ driver
_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
_MARKS = re.compile(r"\[context-parallel-bench\] rank (\d+): startup peak ([0-9.]+) MiB, "
                    r"first step RSS ([0-9.]+) MiB, training peak ([0-9.]+) MiB")
_ADAPTOR_PEAK = re.compile(r"peak memory rank (\d+): RSS ([0-9.]+) MiB")
DEFAULT_ITERS = {4096: 6, 16384: 4, 32768: 3}  # iterations per run (incl. warm-up) when --iters is not given
PACKED_SEQ, PACKED_DOC = 8192, 1024
VOCAB = 512


def _replace(args: list[str], **values) -> list[str]:
    """`args` with the values of existing flags replaced (flag names with _ for -)."""
    out = list(args)
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        out[out.index(flag) + 1] = str(value)
    return out


def model_args(seq: int) -> list[str]:
    from helpers.megatron_runs import TINY_QWEN3_MODEL

    return _replace(TINY_QWEN3_MODEL, seq_length=seq, max_position_embeddings=seq, micro_batch_size=1,
                    global_batch_size=1)


def cp_configs(seq: int) -> list[tuple[str, int, list[str]]]:
    """(name, processes, extra arguments) of part (A) at one length."""
    mock = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB)]
    return [
        ("CP=1 (flash)", 1, mock + ["--use-flash-attn", "--no-create-attention-mask-in-dataloader"]),
        ("CP=2 ring (p2p)", 2, mock + ["--context-parallel-size", "2", "--cp-comm-type", "p2p"]),
        ("CP=2 Ulysses (a2a)", 2, mock + ["--context-parallel-size", "2", "--cp-comm-type", "a2a"]),
    ]


def packed_configs(prefix: Path, cache: Path) -> list[tuple[str, int, list[str]]]:
    data = ["--data-path", str(prefix), "--split", "100,0,0", "--data-cache-path", str(cache),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB), "--reset-attention-mask"]
    return [
        ("8 docs, dense mask (DotProductAttention)", 1, data),
        ("8 docs, packed (--use-flash-attn, THD)", 1, data + ["--use-flash-attn"]),
    ]


def write_packed_dataset(directory: Path, documents: int) -> Path:
    import numpy as np

    from helpers.datasets import write_indexed_dataset

    rng = np.random.default_rng(0)
    eod = VOCAB - 1  # megatron-core's NullTokenizer: eod_id defaults to vocab_size - 1
    docs = [np.concatenate([rng.integers(0, eod, size=PACKED_DOC - 1), [eod]]).astype(np.int32)
            for _ in range(documents)]
    return write_indexed_dataset(directory / "packed_1024", docs, np.int32)


def _cpu() -> dict:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        lscpu = ""
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
                 platform.processor() or platform.machine())
    flags = sorted(set(re.findall(r"\b(avx512_bf16|amx_bf16)\b", lscpu)))
    return {"model": model, "cores": os.cpu_count(), "bf16_instructions": " ".join(flags) or "none"}


def _launch(cmd: list[str], env: dict, timeout: float):
    """Run `cmd` to its end or `timeout`; returns (process, output, timed out)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_tree(proc.pid)
        proc.wait()
    reader.join(timeout=30)
    return proc, "".join(lines), timed_out


def _kill_tree(pid: int) -> None:
    """SIGKILL the launcher this script started and its workers (which torchrun puts in sessions of their own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for process in tree:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def run_one(name: str, seq: int, nproc: int, extra: list[str], iters: int, warmup: int, threads: int,
            timeout: float) -> dict:
    from helpers.megatron_runs import TORCHRUN, free_port

    args = model_args(seq) + ["--train-iters", str(iters)] + extra
    env = dict(os.environ, ADAPTOR_BACKEND="cpu", ADAPTOR_REPORT_MEMORY="1", OMP_NUM_THREADS=str(threads),
               PYTHONUNBUFFERED="1")
    load_start = os.getloadavg()
    for _ in range(3):
        cmd = TORCHRUN + [f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
                          str(Path(__file__).resolve()), "--worker", *args]
        start = time.monotonic()
        proc, out, timed_out = _launch(cmd, env, timeout)
        wall = time.monotonic() - start
        # free_port() closes the port before torchrun binds it; a run beside this one may take it first
        if proc.returncode == 0 or "EADDRINUSE" not in out or _MS.search(out):
            break
    times = [float(x) for x in _MS.findall(out)]
    ranks = {int(r): {"startup_peak_mib": float(a), "first_step_rss_mib": float(b), "training_peak_mib": float(c)}
             for r, a, b, c in _MARKS.findall(out)}
    for r, peak in _ADAPTOR_PEAK.findall(out):
        ranks.setdefault(int(r), {})["adaptor_reported_peak_mib"] = float(peak)
    for m in ranks.values():
        if "training_peak_mib" in m:
            m["peak_rss_mib"] = max(m["startup_peak_mib"], m["training_peak_mib"])
            m["activation_mib"] = m["training_peak_mib"] - m["first_step_rss_mib"]
    ok = proc.returncode == 0 and not timed_out and len(times) >= iters and len(ranks) == nproc
    status = "ok" if ok else ("timed out" if timed_out else f"failed (exit {proc.returncode})")
    timed = times[warmup:]
    result = {
        "name": name, "seq_length": seq, "processes": nproc, "train_iters": iters, "warmup": warmup,
        "status": status, "iteration_ms": times, "median_ms": statistics.median(timed) if timed else None,
        "ranks": {str(r): ranks[r] for r in sorted(ranks)}, "wall_s": round(wall, 1),
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        # what each rank runs: pretrain_gpt.py's main() with these arguments, through --worker
        "command": " ".join([f"ADAPTOR_BACKEND=cpu ADAPTOR_REPORT_MEMORY=1 OMP_NUM_THREADS={threads} torchrun",
                             f"--nproc_per_node={nproc} benchmarks/context_parallel.py --worker", *args]),
    }
    if not ok:
        result["output_tail"] = out[-4000:]
    return result


def _fmt(x, digits=0):
    return "–" if x is None else f"{x:.{digits}f}"


def _largest(r: dict | None, key: str):
    """The largest rank's value of `key` in one result (None where no rank reported it)."""
    return max((m[key] for m in (r or {}).get("ranks", {}).values() if key in m), default=None)


def row(r: dict, reference: dict | None) -> str:
    peak, base = _largest(r, "peak_rss_mib"), _largest(r, "first_step_rss_mib")
    act, ref_act = _largest(r, "activation_mib"), _largest(reference, "activation_mib")
    ratio = f"{act / ref_act:.2f}" if reference is not None and act is not None and ref_act else "–"
    ms = r["median_ms"]
    status = "" if r["status"] == "ok" else f" **{r['status']}** after {len(r['iteration_ms'])} it, {r['wall_s']:.0f} s"
    tok = _fmt(r["seq_length"] / ms * 1000) if ms else "–"
    return (f"| {r['name']} | {r['seq_length']} | {r['processes']} | {_fmt(ms, 1)}{status} | {tok} | "
            f"{_fmt(peak)} | {_fmt(base)} | {_fmt(act)} | {ratio} |")


HEADER = ("| configuration | seq | ranks | ms / iteration | tokens / s | peak RSS / rank, MiB | "
          "RSS at first step / rank, MiB | activation / rank, MiB | activation vs first row |\n"
          "|---|---|---|---|---|---|---|---|---|")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    sys.path.insert(0, str(ROOT / "tests"))  # helpers.megatron_runs, helpers.datasets (not in the workers)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    ap.add_argument("--iters", type=int, help="iterations per run, warm-up included (default: "
                    + ", ".join(f"{k}: {v}" for k, v in DEFAULT_ITERS.items()) + "; 3 for the packed rows)")
    ap.add_argument("--warmup", type=int, default=1, help="first iterations left out of the median")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per process")
    ap.add_argument("--only", nargs="+", choices=["cp", "packed"], default=["cp", "packed"])
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run before it is killed")
    ap.add_argument("--out", default="/tmp/context_parallel_bench.json")
    a = ap.parse_args()

    import torch

    cpu = _cpu()
    meta = {"date": str(date.today()), "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "cpu": cpu, "torch": torch.__version__, "python": platform.python_version(),
            "command": " ".join(["python", "benchmarks/context_parallel.py", *sys.argv[1:]]),
            "threads_per_process": a.threads, "warmup": a.warmup}
    try:
        from importlib.metadata import version
        meta["megatron_core"] = version("megatron-core")
    except Exception:  # noqa: BLE001
        meta["megatron_core"] = None
    results: dict = {"meta": meta, "context_parallel": [], "packed": []}

    def save():
        Path(a.out).write_text(json.dumps(results, indent=1, default=str))

    print(f"# {meta['date']} · {cpu['model']} · {cpu['cores']} cores · "
          f"bf16 instructions: {cpu['bf16_instructions']} · torch {torch.__version__} · backend cpu · fp32 · "
          f"OMP_NUM_THREADS={a.threads} per process · "
          f"median after {a.warmup} warm-up iteration(s)", flush=True)
    if "cp" in a.only:
        print(HEADER, flush=True)
        for seq in a.lengths:
            iters = a.iters or DEFAULT_ITERS.get(seq, 3)
            reference = None
            for name, nproc, extra in cp_configs(seq):
                r = run_one(name, seq, nproc, extra, iters, a.warmup, a.threads, a.timeout)
                results["context_parallel"].append(r)
                print(row(r, reference), flush=True)
                reference = reference or r
                save()
    if "packed" in a.only:
        with tempfile.TemporaryDirectory(prefix="cp_bench_data_") as tmp:
            iters = a.iters or 3
            prefix = write_packed_dataset(Path(tmp), documents=8 * (iters + 2))
            print("\n" + HEADER, flush=True)
            reference = None
            for name, nproc, extra in packed_configs(prefix, Path(tmp) / "cache"):
                r = run_one(name, PACKED_SEQ, nproc, extra, iters, a.warmup, a.threads, a.timeout)
                r["command"] = r["command"].replace(tmp, "$DATA")
                results["packed"].append(r)
                print(row(r, reference), flush=True)
                reference = reference or r
                save()
    meta["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    save()
    print(f"\nwritten to {a.out}")


if __name__ == "__main__":
    main()
