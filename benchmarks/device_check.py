"""The accelerator column of the backend matrix, in one command: run it the day a device is at hand.

    python benchmarks/device_check.py --device cuda      # or npu; --device cpu tries every part here

Each part is a real ``torchrun pretrain_gpt.py`` run with ``ADAPTOR_BACKEND=<device>``, as a user
launches it, and prints one row of one table (about 5 minutes on one GPU, well inside 8):

* the tiny Qwen3 and the tiny DeepSeek-V3 (MLA, MoE, MTP), fp32, from one start checkpoint written on
  CPU: the device's loss curve against the CPU's;
* with two or more devices: TP=2 against one device, and FSDP2 (DP=2) against DDP (DP=2);
* the five dense fused operators on the device against the same run unfused;
* a safetensors checkpoint saved on the device at the middle of a run and resumed: the resumed
  iterations equal the uninterrupted run's;
* the step time and MFU of the tiny Qwen3 with ``--log-throughput``.

Tolerances: the same device and the same kernels give the same bits (0). Device against CPU in fp32:
different GEMM and reduction orders change the last bits of every step, and ten steps of Adam
amplify them; 2e-3 relative still fails a run whose learning rate is 1% off (that moves the curve
by more than 5e-3 by iteration 10 here). ``--device cpu`` compares CPU with CPU, so every gap is 0.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.megatron_runs import TINY_DEEPSEEK_V3, TINY_QWEN3, losses_of  # noqa: E402
from helpers.processes import free_port  # noqa: E402

FUSED = ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-flash-attn",
         "--cross-entropy-loss-fusion"]
ACROSS_DEVICES = 2e-3
SAME_DEVICE = 1e-5  # fused kernels against unfused, and resume against uninterrupted, on one device
_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
_MFU = re.compile(r"MFU: ([0-9.]+) ?%")


def torchrun(args: list[str], env: dict, nproc: int, cwd: Path) -> tuple[int, str]:
    """``torchrun --nproc_per_node nproc pretrain_gpt.py args``: exit status and output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={free_port()}", str(ROOT / "pretrain_gpt.py"), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, **env), capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


class Check:
    def __init__(self, device: str, iters: int, workdir: Path, verbose: bool, launch=torchrun, jobs: int = 1):
        self.device, self.iters, self.workdir, self.verbose, self.launch = device, iters, workdir, verbose, launch
        self.rows: list = []  # (name, verdict, detail), or a future of one while parts run side by side
        self._pool = ThreadPoolExecutor(jobs) if jobs > 1 else None
        self._lock = threading.Lock()
        self._runs: dict = {}  # one run per command line: with --device cpu, "device" and CPU runs coincide

    def torchrun(self, args: list[str], backend: str, nproc: int = 1) -> str:
        key = (tuple(args), backend, nproc)
        with self._lock:  # a run two parts need is made once, the second part waits for it
            run = None if "--save" in args else self._runs.get(key)
            if run is None:
                run = self._runs[key] = Future()
                mine = True
            else:
                mine = False
        if mine:
            try:
                run.set_result(self._launch(args, backend, nproc))
            except Exception as exc:  # noqa: BLE001  (the waiting part fails with it too)
                run.set_exception(exc)
        return run.result()

    def _launch(self, args: list[str], backend: str, nproc: int) -> str:
        env = {"ADAPTOR_BACKEND": backend, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        returncode, output = self.launch(args, env, nproc, self.workdir)
        if self.verbose:
            print(output[-3000:], file=sys.stderr)
        if returncode != 0:
            raise RuntimeError("\n".join(output.splitlines()[-25:]))
        return output

    def curve(self, model: list[str], start: Path, backend: str, nproc: int = 1, extra=()) -> list[float]:
        args = model + ["--train-iters", str(self.iters), "--load", str(start), "--finetune", "--no-load-optim",
                        "--no-load-rng", *extra]
        losses = losses_of(self.torchrun(args, backend, nproc))
        if sorted(losses) != list(range(1, self.iters + 1)):
            raise RuntimeError(f"logged iterations {sorted(losses)}")
        return [losses[i] for i in sorted(losses)]

    def start_checkpoint(self, model: list[str], name: str) -> Path:
        """One CPU iteration at learning rate 0 saves the initial weights: every run starts from them."""
        directory = self.workdir / name
        self.torchrun(model + ["--train-iters", "1", "--lr", "0", "--min-lr", "0", "--save", str(directory),
                               "--save-interval", "1"], "cpu")
        return directory

    def row(self, name: str, run, tolerance: float | None = None, alone: bool = False) -> None:
        """Run one part (beside others with ``--jobs``, unless ``alone``); a part that fails is a row too."""
        if self._pool is not None and not alone:
            self.rows.append(self._pool.submit(self._row, name, run, tolerance))
        else:
            self.finish()
            self.rows.append(self._row(name, run, tolerance))

    def map(self, fn, items) -> list:
        """``fn`` over ``items``, side by side with ``--jobs``."""
        return list(self._pool.map(fn, items) if self._pool is not None else map(fn, items))

    def finish(self) -> list[tuple[str, str, str]]:
        """Every row, in the order the parts were given, once each has run."""
        self.rows = [row.result() if isinstance(row, Future) else row for row in self.rows]
        return self.rows

    def _row(self, name: str, run, tolerance: float | None) -> tuple[str, str, str]:
        started = time.monotonic()
        try:
            result = run()
            if tolerance is None:
                verdict, shown = "ok", result
            else:
                verdict = "ok" if result <= tolerance else "FAIL"
                shown = f"max relative gap {result:.2e} (tolerance {tolerance:.0e})"
        except Exception as exc:  # noqa: BLE001  (reported in the table)
            verdict, shown = "FAIL", " ".join(str(exc).split())[-400:]
        print(f"[device_check] {name}: {verdict}", file=sys.stderr, flush=True)
        return name, verdict, f"{shown}; {time.monotonic() - started:.0f} s"


def gap(curve, reference) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(curve, reference, strict=True))


def device_count(device: str) -> int:
    import torch

    if device == "cuda":
        return torch.cuda.device_count()
    if device == "npu":
        import torch_npu  # noqa: F401

        return torch.npu.device_count()
    return 2  # CPU: two gloo processes


def main(argv=None, launch=torchrun) -> int:
    """``launch(args, env, nproc, cwd) -> (exit status, output)`` starts each run (tests start them warm)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "npu", "cpu"), default="cuda")
    ap.add_argument("--iters", type=int, default=10, help="iterations of each loss curve")
    ap.add_argument("--bench-iters", type=int, default=30, help="iterations of the step-time run")
    ap.add_argument("--jobs", type=int, default=1,
                    help="parts run side by side (the step-time part always runs alone); for CPU checks "
                         "on several cores, where a one-process run leaves the other cores idle")
    ap.add_argument("--verbose", action="store_true")
    opts = ap.parse_args(argv)
    device = opts.device
    tolerance = SAME_DEVICE if device == "cpu" else ACROSS_DEVICES
    count = device_count(device)
    with tempfile.TemporaryDirectory(prefix="device_check_") as tmp:
        check = Check(device, opts.iters, Path(tmp), opts.verbose, launch, opts.jobs)
        qwen_start, dsv3_start = check.map(lambda start: check.start_checkpoint(*start),
                                           [(TINY_QWEN3, "qwen3_start"), (TINY_DEEPSEEK_V3, "dsv3_start")])
        cpu = {}

        def against_cpu(model, start, key):
            cpu[key] = check.curve(model, start, "cpu")
            return gap(check.curve(model, start, device), cpu[key])

        check.row(f"tiny Qwen3 fp32, {device} against CPU", lambda: against_cpu(TINY_QWEN3, qwen_start, "qwen3"),
                  tolerance)
        check.row(f"tiny DeepSeek-V3 fp32 (MLA, MoE, MTP), {device} against CPU",
                  lambda: against_cpu(TINY_DEEPSEEK_V3, dsv3_start, "dsv3"), tolerance)
        if count >= 2:
            check.row(f"TP=2 against 1 {device}", lambda: gap(
                check.curve(TINY_QWEN3, qwen_start, device, 2, ["--tensor-model-parallel-size", "2"]),
                check.curve(TINY_QWEN3, qwen_start, device)), tolerance)
            check.row(f"FSDP2 DP=2 against DDP DP=2 on {device}", lambda: gap(
                check.curve(TINY_QWEN3, qwen_start, device, 2, ["--use-torch-fsdp2"]),
                check.curve(TINY_QWEN3, qwen_start, device, 2)), tolerance)
        else:
            check.rows.append((f"TP=2 and FSDP2 on {device}", "skipped", f"{count} device(s)"))
        check.row(f"five fused operators against unfused on {device}", lambda: gap(
            check.curve(TINY_QWEN3, qwen_start, device, extra=FUSED),
            check.curve(TINY_QWEN3, qwen_start, device)), SAME_DEVICE if device == "cpu" else ACROSS_DEVICES)

        def round_trip() -> float:
            save = Path(tmp) / "round_trip"
            half = max(1, opts.iters // 2)
            base = TINY_QWEN3 + ["--train-iters", str(opts.iters), "--save", str(save), "--save-interval",
                                 str(half), "--ckpt-format", "safetensors"]
            whole = losses_of(check.torchrun(base + ["--exit-interval", str(half)], device))
            resumed = losses_of(check.torchrun(base + ["--load", str(save)], device))
            uninterrupted = losses_of(check.torchrun(TINY_QWEN3 + ["--train-iters", str(opts.iters)], device))
            shutil.rmtree(save, ignore_errors=True)
            if sorted(whole) != list(range(1, half + 1)) or sorted(resumed) != list(range(half + 1, opts.iters + 1)):
                raise RuntimeError(f"iterations before {sorted(whole)}, after {sorted(resumed)}")
            return gap([resumed[i] for i in sorted(resumed)], [uninterrupted[i] for i in sorted(resumed)])

        check.row(f"safetensors checkpoint saved and resumed on {device}", round_trip, SAME_DEVICE)

        def bench() -> str:
            out = check.torchrun(TINY_QWEN3 + ["--train-iters", str(opts.bench_iters), "--log-throughput"], device)
            times = [float(x) for x in _MS.findall(out)][5:] or [float(x) for x in _MS.findall(out)]
            mfu = [float(x) for x in _MFU.findall(out)]
            shown = f"{statistics.median(times):.1f} ms/iteration (median after 5)"
            return shown + (f", MFU {statistics.median(mfu):.3f} %" if mfu else ", MFU not printed (no known peak)")

        check.row(f"step time and MFU, tiny Qwen3 on 1 {device}", bench, alone=True)
        check.finish()

    import torch

    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()
    print(f"Device: {device} ({name}, {count} device(s) usable); torch {torch.__version__}; {date.today()}; "
          f"command: python benchmarks/device_check.py --device {device} --iters {opts.iters}")
    print("| part | result | detail |\n|---|---|---|")
    for name, verdict, detail in check.rows:
        print(f"| {name} | {verdict} | {detail} |")
    return 0 if all(verdict != "FAIL" for _, verdict, _ in check.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
