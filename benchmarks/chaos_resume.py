"""Chaos campaign: SIGKILL training at random moments, resume it, and check every bit against an uninterrupted run.

    python benchmarks/chaos_resume.py --kills 10 --seed 1 --work-dir /tmp/chaos

For each layout (DP=2 + distributed optimizer, PP=2, FSDP2, EP=2 MoE; two processes, the tiny
Qwen3 with dropout 0.1, 12 iterations, a checkpoint every 3) and checkpoint format, one
uninterrupted reference run, then trials of ``--kills-per-trial`` kills each until ``--kills``
kills: each launch is killed as a whole (SIGKILL) at a moment drawn from the seed (between steps,
inside a step, during a synchronous save, during an ``--async-save``, inside the safetensors
commit), the next launch resumes with ``--load``, and the last runs to the end. After every kill,
each finished checkpoint left must equal the reference's of the same iteration; every printed loss
must equal the reference's; the final checkpoint (weights, optimizer state, RNG states) must equal
the reference's bit for bit. The moments and the checks: tests/helpers/chaos_resume.py.
Prints a table; exits 1 at the first difference.

    python benchmarks/chaos_resume.py --worker-kills 6 --seed 1 --work-dir /tmp/chaos

instead SIGKILLs one *worker* of the real torchrun command line (``--max-restarts 1 --rdzv-backend
c10d``, cold) ``--worker-kills`` times on one launcher of two workers and as many times on two
launchers of one worker (DP=2 + distributed optimizer, safetensors), at moments and victims drawn
from the seed; torchrun alone must bring each run back to the reference's losses and final checkpoint.
"""
from __future__ import annotations

import argparse
import collections
import platform
import random
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.chaos_resume import (LAYOUTS, MOMENTS, WORKER_MOMENTS, ChaosError, reference_run,  # noqa: E402
                                  run_trial, run_worker_kill)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--formats", nargs="+", default=["safetensors"], choices=["safetensors", "torch_dist"])
    parser.add_argument("--kills", type=int, default=10, help="kills per layout and format")
    parser.add_argument("--kills-per-trial", type=int, default=2, help="kills before a trial's run is let finish")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--worker-kills", type=int, default=0,
                        help="kill one worker under torchrun --max-restarts this many times per launcher count instead")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/chaos_resume"))
    opts = parser.parse_args()
    opts.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    import torch

    print(f"chaos resume campaign: {date.today()}, {cpu_model()}, {len(__import__('os').sched_getaffinity(0))} cores, "
          f"torch {torch.__version__}; seed {opts.seed}; command: python benchmarks/chaos_resume.py "
          + " ".join(sys.argv[1:]), flush=True)
    if opts.worker_kills:
        return worker_kills(opts, started)
    rows = []
    for fmt in opts.formats:
        for layout in opts.layouts:
            rng = random.Random(f"{opts.seed}-{layout}-{fmt}")
            t0 = time.monotonic()
            ref = reference_run(layout, fmt, opts.work_dir)
            print(f"{layout} {fmt}: reference done (step {ref.step_s * 1000:.0f} ms, save {ref.save_s * 1000:.0f} ms)",
                  flush=True)
            kills, launches, checked, tensors, trials = [], 0, 0, 0, 0
            try:
                while len(kills) < opts.kills:
                    n = min(opts.kills_per_trial, opts.kills - len(kills))
                    trial = run_trial(ref, opts.work_dir, rng, n, log=lambda s: print(s, flush=True))
                    trials += 1
                    kills += [k for k in trial.kills if k.landed]
                    launches += trial.launches
                    checked += trial.checkpoints_checked
                    tensors = trial.tensors_compared
                    print(f"{layout} {fmt}: trial {trials} bit-exact ({len(trial.kills)} kills, {trial.launches} launches, "
                          f"{trial.seconds:.0f} s)", flush=True)
            except ChaosError as exc:
                print(f"FAILED: {exc}", flush=True)
                return 1
            by_moment = collections.Counter(k.moment for k in kills)
            rows.append((layout, fmt, len(kills), trials, launches, checked, tensors,
                         ", ".join(f"{m} {by_moment[m]}" for m in MOMENTS if by_moment[m]),
                         (time.monotonic() - t0) / 60))
    print()
    print("| layout | format | kills | trials | launches | checkpoints left by kills, all equal | final tensors equal | kills by moment | minutes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for layout, fmt, k, trials, launches, checked, tensors, moments, minutes in rows:
        print(f"| {layout} | {fmt} | {k} | {trials} | {launches} | {checked} | {tensors} | {moments} | {minutes:.1f} |")
    total = sum(r[2] for r in rows)
    print(f"\n{total} kills over {len(rows)} layout/format pairs, every resumed run bit-exact; "
          f"{(time.monotonic() - started) / 60:.1f} min")
    return 0


def worker_kills(opts, started: float) -> int:
    rng = random.Random(f"{opts.seed}-worker-kills")
    ref = reference_run("dp2_distopt", "safetensors", opts.work_dir)
    print("| launchers | kill | moment | iteration | delay (ms) | victim | resumed from | bit-exact | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    exact = collections.Counter()
    for nodes in (1, 2):
        for n in range(opts.worker_kills):
            moment = WORKER_MOMENTS[n % len(WORKER_MOMENTS)]
            try:
                k = run_worker_kill(ref, opts.work_dir, rng, moment, nodes=nodes)
            except ChaosError as exc:
                print(f"FAILED: {exc}", flush=True)
                return 1
            exact[nodes] += 1
            print(f"| {nodes} | {n + 1} | {k.moment} | {k.iteration} | {k.delay_s * 1000:.0f} | {k.victim} | "
                  f"{k.resumed_from} | yes | {k.seconds:.0f} |", flush=True)
    print(f"\none launcher: {exact[1]}/{opts.worker_kills} bit-exact; two launchers: {exact[2]}/{opts.worker_kills} "
          f"bit-exact; {(time.monotonic() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
