"""Kill training with SIGKILL at random moments, resume it from --load, and check it bit for bit.

One *trial* trains a layout from scratch to ``ITERS`` iterations with a checkpoint every
``INTERVAL``, the way a job restarted after every failure would: launch, kill the whole process
tree at a moment drawn from a seeded ``random.Random``, launch again with ``--load`` from what the
kill left, and so on; the last launch runs to the end. It is compared with one uninterrupted run
of the same command (the *reference*), which keeps every checkpoint:

* after every kill, each finished checkpoint directory left under ``--save`` equals the reference's
  checkpoint of the same iteration (every tensor, the optimizer state, the RNG states, the common
  state), and the tracker names one of them (or is absent); a directory that is not finished is
  never one ``--load`` would read;
* every loss a launch printed is the reference's loss of that iteration, to the last digit;
* the final checkpoint (saved at the last iteration) equals the reference's.

Moments (``MOMENTS``), each found by watching the run's output, never by slowing Megatron:

* ``between_steps``: at the log line of iteration k (the optimizer step is done);
* ``in_step``: a random fraction of one step after that line (the next forward/backward/step);
* ``sync_save``: a random delay, up to the reference's save time, after "saving checkpoint at iteration k";
* ``async_save`` (``--ckpt-format safetensors``): the same with ``--async-save`` (state copy, the
  background write, the commit of a later step), delays up to twice the save time plus two steps;
* ``commit_staged`` / ``commit_marked`` / ``commit_renamed`` (``--ckpt-format safetensors``): the
  run is started through ``tests/scripts/pretrain_gpt_stalled_commit.py``, which holds rank 0's
  commit of iteration k's save at that point (files written / marker written / directory renamed
  but tracker not yet updated) and prints a line; the kill follows the line.

A kill reaches the launcher and every process under it (workers, the async checkpoint worker) at
once, found by an environment variable each launch carries.
"""
from __future__ import annotations

import os
import queue
import random
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from helpers.checkpoint_compare import checkpoint_differences, checkpoint_format
from helpers.megatron_runs import LOSS_LINE, ROOT, TINY_QWEN3, tail
from helpers.warm_launcher import base_env, start

ITERS = 12
INTERVAL = 3
DROPOUT = "0.1"


def _with_dropout(args: list[str]) -> list[str]:
    args = list(args)
    for flag in ("--attention-dropout", "--hidden-dropout"):
        args[args.index(flag) + 1] = DROPOUT
    return args


MODEL = _with_dropout(TINY_QWEN3)
# A tiny MoE on the same model: 4 experts, top-2, alltoall dispatch, aux loss; split over 2 EP ranks.
MOE = ["--num-experts", "4", "--moe-ffn-hidden-size", "64", "--moe-router-topk", "2",
       "--moe-token-dispatcher-type", "alltoall", "--moe-router-load-balancing-type", "aux_loss",
       "--moe-aux-loss-coeff", "1e-2"]
# Two processes each.
LAYOUTS = {
    "dp2_distopt": ["--use-distributed-optimizer"],
    "pp2": ["--pipeline-model-parallel-size", "2"],
    "fsdp2": ["--use-torch-fsdp2"],
    "ep2": MOE + ["--expert-model-parallel-size", "2", "--use-distributed-optimizer"],
}
NPROC = 2
MOMENTS = ("between_steps", "in_step", "sync_save", "async_save", "commit_staged", "commit_marked", "commit_renamed")
STALLED_SCRIPT = "tests/scripts/pretrain_gpt_stalled_commit.py"
_TRACKER = "latest_checkpointed_iteration.txt"
_STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]"
_SAVING = re.compile(_STAMP + r" saving checkpoint at iteration\s+(\d+)")
_SAVED = re.compile(_STAMP + r" successfully saved checkpoint from iteration\s+(\d+)")
_STEP_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")


def moments_for(fmt: str) -> tuple[str, ...]:
    """The commit points are our safetensors writer's; a torch_dist ``--async-save`` needs Megatron's
    persistent checkpoint worker (``--use-persistent-ckpt-worker --async-strategy mcore``), not
    drawn here."""
    if fmt == "safetensors":
        return MOMENTS
    return tuple(m for m in MOMENTS if not m.startswith("commit_") and m != "async_save")


def train_args(layout: str, save: Path, fmt: str, *extra: str, iters: int = ITERS, interval: int = INTERVAL) -> list[str]:
    args = MODEL + LAYOUTS[layout] + ["--train-iters", str(iters), "--save", str(save),
                                      "--save-interval", str(interval), *extra]
    if fmt != "torch_dist":  # torch_dist is Megatron's default: the command line does not name it
        args += ["--ckpt-format", fmt]
    return args


class ChaosError(AssertionError):
    pass


# ------------------------------------------------------------------------------ one launch
class Launch:
    """One torchrun launch whose output is read line by line while it runs, and killed as a whole."""

    def __init__(self, args: list[str], env: dict | None = None, script: str = "pretrain_gpt.py"):
        self.tag = uuid.uuid4().hex
        self.proc = start(ROOT / script, args, nproc=NPROC, env=base_env(dict(env or {}, CHAOS_LAUNCH=self.tag)),
                          merge_stderr=True)
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, regex: re.Pattern, timeout: float) -> str | None:
        """The first line matching ``regex``; None when the run ends first; ChaosError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise ChaosError(f"no line matching {regex.pattern!r} within {timeout} s:\n{tail(self.output)}")
            if line is None:
                self._queue.put(None)
                return None
            self.lines.append(line)
            if regex.search(line):
                return line

    def _ours(self):
        import psutil

        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("CHAOS_LAUNCH") == self.tag:
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    def kill(self) -> None:
        """SIGKILL the launcher's process group, then every process that carries this launch's tag."""
        import psutil

        try:
            tree = [psutil.Process(self.proc.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for process in tree:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        for _ in range(3):  # cold: workers in sessions of their own, orphans of the killed launcher
            rest = self._ours()
            if not rest:
                break
            for process in rest:
                try:
                    process.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(rest, timeout=10)
        self.proc.wait(timeout=60)
        self._drain(timeout=10)

    def _drain(self, timeout: float) -> None:
        while True:
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                return
            if line is None:
                self._queue.put(None)
                return
            self.lines.append(line)

    def finish(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ChaosError(f"the run did not end within {timeout} s:\n{tail(self.output)}") from None
        self._drain(timeout=60)
        return self.proc.returncode

    @property
    def output(self) -> str:
        return "".join(self.lines)


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").timestamp()


# ------------------------------------------------------------------------------ the reference
@dataclass
class Reference:
    layout: str
    fmt: str
    save: Path
    losses: dict[int, float]
    step_s: float  # median time of one step
    save_s: float  # longest save, "saving" line to "successfully saved" line


def reference_run(layout: str, fmt: str, workdir: Path, timeout: float = 600) -> Reference:
    """The uninterrupted run: every checkpoint kept, its losses and timings."""
    save = workdir / f"reference-{layout}-{fmt}"
    shutil.rmtree(save, ignore_errors=True)
    launch = Launch(train_args(layout, save, fmt))
    if launch.finish(timeout) != 0:
        raise ChaosError(f"reference run {layout} {fmt} failed:\n{tail(launch.output)}")
    out = launch.output
    losses = {int(i): float(v) for i, v in LOSS_LINE.findall(out)}
    if sorted(losses) != list(range(1, ITERS + 1)):
        raise ChaosError(f"reference run {layout} {fmt} logged iterations {sorted(losses)}:\n{tail(out)}")
    steps = sorted(float(ms) / 1000 for ms in _STEP_MS.findall(out)[1:]) or [0.2]
    starts = {int(i): _stamp(t) for t, i in _SAVING.findall(out)}
    ends = {int(i): _stamp(t) for t, i in _SAVED.findall(out)}
    save_s = max((ends[i] - starts[i] for i in starts if i in ends), default=0.5)
    for it in range(INTERVAL, ITERS + 1, INTERVAL):
        if checkpoint_format(save / f"iter_{it:07d}") != fmt:
            raise ChaosError(f"reference run {layout} {fmt}: no finished checkpoint at iteration {it}")
    return Reference(layout, fmt, save, losses, steps[len(steps) // 2], save_s)


# ------------------------------------------------------------------------------ a trial
@dataclass
class Kill:
    moment: str
    iteration: int  # the iteration whose log line or save the moment follows
    delay_s: float
    resumed_from: int  # the tracker's iteration at launch (0: from scratch)
    left: str = ""  # what the kill left under --save
    tracker_after: int = 0
    landed: bool = True  # False: the run had already ended by itself


@dataclass
class Trial:
    layout: str
    fmt: str
    kills: list[Kill] = field(default_factory=list)
    launches: int = 0
    checkpoints_checked: int = 0  # finished directories compared with the reference after kills
    tensors_compared: int = 0  # in the final checkpoint
    seconds: float = 0.0


def tracker_iteration(save: Path) -> int:
    try:
        return int((save / _TRACKER).read_text().strip())
    except (OSError, ValueError):
        return 0


def _what_is_left(save: Path) -> str:
    if not save.is_dir():
        return "nothing"
    names = sorted(p.name for p in save.iterdir())
    return ", ".join(n for n in names if n != _TRACKER) + f"; tracker {tracker_iteration(save) or '-'}"


class Checker:
    """Compares what a kill left with the reference; each finished directory once per content."""

    def __init__(self, ref: Reference):
        self.ref = ref
        self._seen: dict[tuple, None] = {}
        self.checked = 0

    def checkpoints(self, save: Path, where: str) -> None:
        if not save.is_dir():
            return
        tracker = (save / _TRACKER)
        if tracker.exists():
            text = tracker.read_text().strip()
            if not text.isdigit() or checkpoint_format(save / f"iter_{int(text):07d}") != self.ref.fmt:
                raise ChaosError(f"{where}: the tracker says {text!r}, not a finished checkpoint ({_what_is_left(save)})")
        for d in sorted(save.glob("iter_*")):
            if checkpoint_format(d) is None:
                if self.ref.fmt == "safetensors":
                    # Megatron's rank 0 makes the empty directory before the save; ours renames it away.
                    if any(d.iterdir()):
                        raise ChaosError(f"{where}: {d} holds files but no marker")
                continue
            if self.ref.fmt == "torch_dist" and int(d.name[5:]) > tracker_iteration(save):
                continue  # torch_dist writes in place; a directory past the tracker may be unfinished
            key = (d.name, tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in d.iterdir())))
            if key in self._seen:
                continue
            diffs, _ = checkpoint_differences(self.ref.save / d.name, d)
            if diffs:
                raise ChaosError(f"{where}: {d} loads but differs from the uninterrupted run's:\n" + "\n".join(diffs))
            self._seen[key] = None
            self.checked += 1

    def losses(self, launch: Launch, where: str) -> None:
        got = {int(i): float(v) for i, v in LOSS_LINE.findall(launch.output)}
        wrong = {i: (v, self.ref.losses.get(i)) for i, v in got.items() if self.ref.losses.get(i) != v}
        if wrong:
            raise ChaosError(f"{where}: losses differ from the uninterrupted run's (got, expected): {wrong}")


def _save_iterations(after: int) -> list[int]:
    return [i for i in range(INTERVAL, ITERS + 1, INTERVAL) if i > after]


def plan_kill(rng: random.Random, moment: str, start: int, ref: Reference) -> tuple[int, float]:
    """(iteration, delay) for one kill of a launch resuming at ``start``."""
    if moment in ("between_steps", "in_step"):
        it = rng.randint(start + 1, ITERS - 1)
        return it, 0.0 if moment == "between_steps" else rng.uniform(0.05, 0.95) * ref.step_s
    it = rng.choice(_save_iterations(start))
    # not the last save for timed kills: the run ends right after it, so a save faster than the
    # reference's (a quieter machine) would let the run exit before the kill
    timed = rng.choice(_save_iterations(start)[:-1] or [it])
    if moment == "sync_save":
        return timed, rng.uniform(0.0, ref.save_s)
    if moment == "async_save":
        return timed, rng.uniform(0.0, 2 * ref.save_s + 2 * ref.step_s)
    return it, 0.0


def run_trial(ref: Reference, workdir: Path, rng: random.Random, kills: int, moments=None,
              timeout: float = 600, log=print) -> Trial:
    """One layout trained to the end through ``kills`` kills; raises ChaosError on any difference."""
    moments = tuple(moments or moments_for(ref.fmt))
    save = workdir / f"chaos-{ref.layout}-{ref.fmt}"
    shutil.rmtree(save, ignore_errors=True)
    save.mkdir(parents=True)
    trial = Trial(ref.layout, ref.fmt)
    checker = Checker(ref)
    t0 = time.monotonic()
    for n in range(kills):
        start = tracker_iteration(save)
        if start >= ITERS:
            break
        moment = rng.choice(moments)
        it, delay = plan_kill(rng, moment, start, ref)
        extra = ["--load", str(save)] if start else []
        env, script = {}, "pretrain_gpt.py"
        if moment == "async_save":
            extra.append("--async-save")
        if moment.startswith("commit_"):
            env = {"STALL_AT_ITERATION": str(it), "STALL_POINT": moment.split("_", 1)[1]}
            script = STALLED_SCRIPT
            trigger = re.compile(r"^STALLED ")
        elif moment in ("between_steps", "in_step"):
            trigger = re.compile(rf"iteration\s+{it}/\s*{ITERS} ")
        else:
            trigger = re.compile(rf"saving checkpoint at iteration\s+{it} ")
        where = f"{ref.layout} {ref.fmt} kill {n + 1} ({moment} at iteration {it}, +{delay * 1000:.0f} ms)"
        launch = Launch(train_args(ref.layout, save, ref.fmt, *extra), env=env, script=script)
        trial.launches += 1
        line = launch.wait_for(trigger, timeout)
        if line is None:
            raise ChaosError(f"{where}: the run ended (exit {launch.proc.returncode}) before the moment:\n"
                             f"{tail(launch.output)}")
        time.sleep(delay)
        landed = launch.proc.poll() is None
        launch.kill()
        kill = Kill(moment, it, delay, start, _what_is_left(save), tracker_iteration(save), landed)
        trial.kills.append(kill)
        log(f"  {where}: {'left' if landed else 'the run had ended; left'} {kill.left}")
        checker.losses(launch, where)
        checker.checkpoints(save, where)
    start = tracker_iteration(save)
    launch = Launch(train_args(ref.layout, save, ref.fmt, *(["--load", str(save)] if start else [])))
    trial.launches += 1
    where = f"{ref.layout} {ref.fmt} final launch (from iteration {start})"
    if launch.finish(timeout) != 0:
        raise ChaosError(f"{where} failed:\n{tail(launch.output)}")
    checker.losses(launch, where)
    checker.checkpoints(save, where)
    last = save / f"iter_{ITERS:07d}"
    diffs, count = checkpoint_differences(ref.save / last.name, last)
    if diffs:
        raise ChaosError(f"{where}: the final checkpoint differs from the uninterrupted run's:\n" + "\n".join(diffs))
    if tracker_iteration(save) != ITERS:
        raise ChaosError(f"{where}: the tracker says {tracker_iteration(save)}, not {ITERS}")
    trial.checkpoints_checked = checker.checked
    trial.tensors_compared = count
    trial.seconds = time.monotonic() - t0
    return trial


# ------------------------------------------------------------------------------ one worker killed, torchrun restarts it
# The launcher lives on: torchrun (``--max-restarts``, c10d rendezvous on 127.0.0.1) sees one worker die, stops the
# others and starts the whole group again, which resumes from the latest checkpoint. Cold, through torchrun's own
# command line, as users launch it; one node with NPROC workers, or ``nodes`` launchers with one worker each.
WORKER_MOMENTS = ("between_steps", "in_step", "sync_save", "async_save")


@dataclass
class WorkerKill:
    moment: str
    iteration: int
    delay_s: float
    victim: str  # "rank of node N" / "local rank N"
    resumed_from: int = 0  # the iteration the restarted attempt loaded
    seconds: float = 0.0


class ElasticLaunch:
    """``nodes`` torchrun launchers of one c10d rendezvous on this host (NPROC workers in all), output merged."""

    def __init__(self, args: list[str], nodes: int = 1, restarts: int = 1, rendezvous: str = "c10d"):
        import sys

        from helpers.processes import free_port

        self.tag = uuid.uuid4().hex
        port = free_port()
        self.procs = []
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        for node in range(nodes):
            where = (["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"] if rendezvous == "c10d"
                     else ["--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", str(node)])
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
                   "--nproc-per-node", str(NPROC // nodes), "--max-restarts", str(restarts), *where,
                   str(ROOT / "pretrain_gpt.py"), *args]
            proc = subprocess.Popen(cmd, cwd=ROOT, env=base_env({"CHAOS_LAUNCH": self.tag}), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            self.procs.append(proc)
            threading.Thread(target=self._pump, args=(proc,), daemon=True).start()
        self._open = nodes

    def _pump(self, proc) -> None:
        for line in proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, regex: re.Pattern, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise ChaosError(f"no line matching {regex.pattern!r} within {timeout} s:\n{tail(self.output)}")
            if line is None:
                self._open -= 1
                if self._open == 0:
                    return None
                continue
            self.lines.append(line)
            if regex.search(line):
                return line

    def worker(self, node: int, local_rank: int):
        """The worker process torchrun ``node`` runs as ``local_rank`` now."""
        import psutil

        for child in psutil.Process(self.procs[node].pid).children():
            try:
                if child.environ().get("LOCAL_RANK") == str(local_rank):
                    return child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        raise ChaosError(f"launcher {node} runs no worker of local rank {local_rank}:\n{tail(self.output)}")

    def finish(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            raise ChaosError(f"the run did not end within {timeout} s:\n{tail(self.output)}") from None
        # A process the killed worker left (an --async-save writer, orphaned) holds the pipes open: end it.
        self.kill()
        while self._open:
            line = self._queue.get(timeout=60)
            if line is None:
                self._open -= 1
            else:
                self.lines.append(line)
        return codes

    def kill(self) -> None:
        import psutil

        for process in psutil.process_iter():
            try:
                if process.environ().get("CHAOS_LAUNCH") == self.tag:
                    process.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        for p in self.procs:
            p.wait(timeout=60)

    @property
    def output(self) -> str:
        return "".join(self.lines)


_LOADED = re.compile(r"successfully loaded checkpoint from .* at iteration\s+(\d+)")


def run_worker_kill(ref: Reference, workdir: Path, rng: random.Random, moment: str, nodes: int = 1,
                    victim: int | None = None, iteration: int | None = None, timeout: float = 600) -> WorkerKill:
    """One worker SIGKILLed at ``moment`` of a run torchrun may restart once; the run must come back by
    itself from the latest checkpoint and end on the reference's losses and final checkpoint, bit for bit."""
    save = workdir / f"worker-kill-{nodes}-{moment}"
    shutil.rmtree(save, ignore_errors=True)
    it, delay = plan_kill(rng, moment, 0, ref)
    it = it if iteration is None else iteration
    victim = rng.randrange(NPROC) if victim is None else victim  # the node (two launchers) or local rank
    node, local_rank = (victim, 0) if nodes > 1 else (0, victim)
    who = f"the worker of node {node}" if nodes > 1 else f"local rank {local_rank}"
    where = f"{ref.layout} {ref.fmt} {nodes} launcher(s): {who} killed ({moment} at iteration {it}, +{delay * 1000:.0f} ms)"
    # A bounded process-group timeout: an attempt that cannot form its groups ends in a line, not a hang.
    extra = ["--load", str(save), "--distributed-timeout-seconds", "90"] + (["--async-save"] if moment == "async_save" else [])
    t0 = time.monotonic()
    launch = ElasticLaunch(train_args(ref.layout, save, ref.fmt, *extra), nodes=nodes)
    trigger = (re.compile(rf"iteration\s+{it}/\s*{ITERS} ") if moment in ("between_steps", "in_step")
               else re.compile(rf"saving checkpoint at iteration\s+{it} "))
    if launch.wait_for(trigger, timeout) is None:
        raise ChaosError(f"{where}: the run ended before the moment:\n{tail(launch.output)}")
    time.sleep(delay)
    launch.worker(node, local_rank).kill()
    codes = launch.finish(timeout)
    out = launch.output
    if any(codes):
        raise ChaosError(f"{where}: torchrun exited {codes} instead of restarting the run:\n{tail(out)}")
    if out.count("> initializing torch distributed") < 2:
        raise ChaosError(f"{where}: torchrun did not restart the run:\n{tail(out)}")
    loaded = [int(i) for i in _LOADED.findall(out)] or [0]
    if loaded[-1] != max((i for i in range(INTERVAL, it + 1, INTERVAL)), default=0) and moment == "between_steps":
        raise ChaosError(f"{where}: resumed from iteration {loaded[-1]}, not the latest checkpoint:\n{tail(out)}")
    checker = Checker(ref)
    checker.losses(launch, where)
    checker.checkpoints(save, where)
    got = {int(i) for i, _ in LOSS_LINE.findall(out)}
    if got != set(range(1, ITERS + 1)):
        raise ChaosError(f"{where}: logged iterations {sorted(got)}:\n{tail(out)}")
    diffs, _ = checkpoint_differences(ref.save / f"iter_{ITERS:07d}", save / f"iter_{ITERS:07d}")
    if diffs:
        raise ChaosError(f"{where}: the final checkpoint differs from the uninterrupted run's:\n" + "\n".join(diffs))
    return WorkerKill(moment, it, delay, who, loaded[-1], time.monotonic() - t0)
