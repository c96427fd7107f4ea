"""Run pretrain_gpt.py through torchrun, as a user would, and read its loss curve."""
from __future__ import annotations

import re
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from helpers.paths import ROOT, SAMPLE_CORPUS, SAMPLE_TOKENIZER  # noqa: F401  (re-exported)
from helpers.processes import free_port, run_tool  # noqa: F401  (free_port re-exported)
from helpers.warm_launcher import TORCHRUN, Launched, base_env, finish_cold_report, start  # noqa: F401

# A Qwen3-shaped model small enough for two CPU cores: GQA, qk-layernorm,
# kv-channels != hidden/heads, RMSNorm, SwiGLU, RoPE base 1e6, tied embeddings.
# Megatron's torch.compile'd fusions run as plain Python in the tiny test models: compiling them costs
# each rank one to two seconds of inductor per run, and what the tests prove (layouts, checkpoints,
# our kernels) does not depend on it. The compiled path runs in the example scripts' tests, the
# MindSpeed-LLM command lines and tests/unit/test_disable_jit_fuser.py.
UNCOMPILED = ["--disable-jit-fuser"]
TINY_QWEN3 = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "192",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--kv-channels", "32", "--qk-layernorm", "--normalization", "RMSNorm", "--swiglu",
    "--disable-bias-linear", "--position-embedding-type", "rope", "--rotary-base", "1000000",
    "--seq-length", "64", "--max-position-embeddings", "64",
    "--attention-dropout", "0", "--hidden-dropout", "0",
    "--micro-batch-size", "2", "--global-batch-size", "8",
    "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--clip-grad", "1.0",
    "--seed", "1234", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000",
    *UNCOMPILED,
]
TINY_QWEN3_MODEL = list(TINY_QWEN3)  # without data: for runs on real datasets
TINY_QWEN3 += ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512"]
# A DeepSeek-V3-shaped model at the same scale: MLA (q/kv LoRA ranks, qk 16+8 rope dims, v 16,
# q/kv layernorms, YaRN RoPE), one dense layer then MoE layers (4 experts, top-2 of 2 groups
# limited to 1, sigmoid scores with expert bias, scaling 2.5, a shared expert, seq aux loss),
# alltoall dispatch, one MTP layer, untied embeddings. 4 layers so that PP=2 splits evenly.
TINY_DEEPSEEK_V3 = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--num-attention-heads", "4",
    "--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "24",
    "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--qk-layernorm",
    "--rope-type", "yarn", "--rotary-base", "10000", "--rotary-scaling-factor", "4",
    "--yarn-original-max-position-embeddings", "16", "--mscale", "1.0", "--mscale-all-dim", "1.0",
    "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
    "--untie-embeddings-and-output-weights",
    "--num-experts", "4", "--moe-layer-freq", "[0,1,1,1]", "--moe-ffn-hidden-size", "32",
    "--moe-shared-expert-intermediate-size", "32", "--moe-router-topk", "2",
    "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
    "--moe-router-num-groups", "2", "--moe-router-group-topk", "1", "--moe-router-topk-scaling-factor", "2.5",
    "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-3",
    "--moe-router-dtype", "fp32", "--moe-token-dispatcher-type", "alltoall",
    "--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.1",
    "--seq-length", "64", "--max-position-embeddings", "64",
    "--attention-dropout", "0", "--hidden-dropout", "0",
    "--micro-batch-size", "2", "--global-batch-size", "8",
    "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--clip-grad", "1.0",
    "--seed", "1234", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512", *UNCOMPILED,
]

# One logged iteration's lm loss (and MTP loss) in Megatron's training log.
LOSS_LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?lm loss: ([0-9.Ee+-]+)")
_LOSS = LOSS_LINE
_MTP_LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?mtp_1 loss: ([0-9.Ee+-]+)")


@dataclass
class Run:
    """One run's record: exit status, output, loss curves, each rank's exit, where it started and how long it took."""

    returncode: int
    output: str
    losses: dict[int, float]
    mtp_losses: dict[int, float]
    stdout: str = ""
    stderr: str = ""
    exitcodes: list[int] | None = None
    first_failure: tuple[int, int] | None = None
    warm: bool = False
    threads_at_fork: int | None = None  # the zygote's thread count when it forked this run (warm only)
    user_path: bool = False  # cold, or warm in the user's import order (helpers/warm_launcher.py)
    wall_s: float = 0.0
    command: list[str] = field(default_factory=list)

    def curve(self) -> list[float]:
        return [self.losses[i] for i in sorted(self.losses)]

    def error_lines(self) -> list[str]:
        """The ``megatron-adaptor: error:`` lines the run printed."""
        return [line for line in self.output.splitlines() if line.startswith("megatron-adaptor: error:")]


def side_by_side(*jobs):
    """Run independent jobs two at a time and return their results in order.

    Our runs use one thread per process (OMP_NUM_THREADS=1), so a one-process run leaves the second
    core idle; pairing two of them roughly halves their wall time. Each job is a no-argument callable.
    """
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(job) for job in jobs]
        return [f.result() for f in futures]


class TwoAtATime:
    """Independent one-process jobs started now, two at a time, each waited for by the test that needs it.

    ``start(jobs)`` (a dict of no-argument callables) returns ``{key: Future}`` at once; a test calls
    ``.result()`` on its own future, so each job's failure is reported by its own test. A module fixture
    that starts a module's one-process runs this way keeps both cores busy while its tests go on.
    ``close()`` waits for what is still running.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(2)

    def start(self, jobs: dict) -> dict:
        return {key: self._pool.submit(job) for key, job in jobs.items()}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def losses_of(output: str) -> dict[int, float]:
    """Iteration -> lm loss, as Megatron logged them."""
    return {int(i): float(v) for i, v in LOSS_LINE.findall(output)}


def worst_relative_gap(curve, reference) -> float:
    """max |a - b| / |b| over two loss curves, iteration by iteration."""
    return max(abs(a - b) / abs(b) for a, b in zip(curve, reference))


def _parsed(returncode: int, output: str) -> Run:
    losses = losses_of(output)
    mtp_losses = {int(i): float(v) for i, v in _MTP_LOSS.findall(output)}
    return Run(returncode, output, losses, mtp_losses)


def record(launched: Launched, stdout: str, stderr: str) -> Run:
    """The run record of a finished launch."""
    output = stdout + stderr
    finish_cold_report(launched, output)
    run = _parsed(launched.returncode, output)
    run.stdout, run.stderr = stdout, stderr
    run.exitcodes, run.first_failure = launched.exitcodes, launched.first_failure
    run.warm, run.wall_s, run.command = launched.warm, launched.wall_s or 0.0, launched.command
    run.threads_at_fork = launched.threads_at_fork
    run.user_path = not launched.warm or launched.user_order
    if launched.user_order:
        check_import_hook_route(output)
    return run


# The start banner's count of patches still waiting for their module: "(40 more when their module is
# first imported)" in a process that ran ``import adaptor`` before Megatron.
_PATCHES_LINE = re.compile(r"\[megatron-adaptor\] \d+ patches applied( \(\d+ more when their module is first imported\))?:")


def check_import_hook_route(output: str) -> None:
    """A launch in the user's import order whose banner shows every patch applied at once had Megatron
    imported before ``import adaptor``: it would prove nothing about the import hooks, so it fails."""
    for match in _PATCHES_LINE.finditer(output):
        if not match.group(1):
            raise AssertionError("a launch in the user's import order applied every patch at import adaptor: "
                                 f"Megatron was imported first\n{tail(output)}")


def finish(launched: Launched, timeout: float) -> Run:
    """Wait for ``launched`` to end and return its record; past ``timeout`` every rank is killed and the
    test fails with the output so far."""
    try:
        stdout, stderr = launched.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"no exit within {timeout} s: {' '.join(map(str, launched.command))}\n"
                             f"{tail((exc.output or '') + (exc.stderr or ''))}") from None
    return record(launched, stdout, stderr)


def launch(script, args=(), nproc: int = 1, env: dict | None = None, timeout: float = 600, *,
           launcher: str = "torchrun", warm: bool = True, cwd=ROOT, code: str | None = None,
           merge_stderr: bool = False) -> Run:
    """Run ``script`` (relative to the repository, or a path) to its end and return its record.

    ``env`` adds to the test environment (one thread per process, cpu backend, no launcher variables);
    ``launcher="python"`` is a user's plain ``python script.py``; ``warm=False`` always starts cold, as
    the user's command line (helpers/warm_launcher.py). A timeout kills every rank and fails the test.
    """
    script = script if script == "-c" else str(ROOT / script)
    return finish(start(script, args, nproc=nproc, env=base_env(env), launcher=launcher, cwd=cwd, warm=warm,
                        code=code, merge_stderr=merge_stderr), timeout)


def run_pretrain(args: list[str], nproc: int = 1, env: dict | None = None, timeout: int = 600,
                 script: str = "pretrain_gpt.py", torchrun: bool = True, warm: bool = True) -> Run:
    return launch(script, args, nproc, env, timeout, launcher="torchrun" if torchrun else "python", warm=warm)


def save_start_checkpoint(model_args: list[str], directory) -> None:
    """One iteration at lr 0 changes nothing and lets Megatron save the initial weights in ``directory``:
    the common start of loss-curve comparisons (Megatron seeds pipeline stages differently, so runs
    at other layouts must load the same weights rather than draw their own)."""
    run = run_pretrain(list(model_args) + ["--train-iters", "1", "--lr", "0", "--min-lr", "0",
                                           "--save", str(directory), "--save-interval", "1"])
    assert run.returncode == 0, tail(run.output)


def train_from(model_args: list[str], ckpt, iters: int, nproc: int = 1, extra=(), *, first: int = 1,
               resume: bool = False, env: dict | None = None, warm: bool = True,
               script: str = "pretrain_gpt.py") -> Run:
    """``iters`` iterations from the weights in ``ckpt``, asserting the run ended well and logged every one.

    By default the weights only (``--finetune``, no optimizer or RNG state): the common start of the
    loss-curve comparisons, where each layout must begin from the same weights. ``resume`` continues
    the run that saved ``ckpt`` instead, from iteration ``first``."""
    start = [] if resume else ["--finetune", "--no-load-optim", "--no-load-rng"]
    args = list(model_args) + ["--train-iters", str(iters), "--load", str(ckpt), *start, *extra]
    run = launch(script, args, nproc, env, warm=warm)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(first, iters + 1)), tail(run.output)
    return run


def tokenize_sample_corpus(out) -> str:
    """The embedded corpus through tools/preprocess_data.py (GeneralPretrainHandler, EOD appended) into
    ``out``; the dataset prefix Megatron's --data-path takes."""
    proc = run_tool("preprocess_data.py", "--input", SAMPLE_CORPUS, "--output-prefix", out / "corpus",
                    "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", str(SAMPLE_TOKENIZER),
                    "--handler-name", "GeneralPretrainHandler", "--append-eod", "--workers", "1",
                    "--log-interval", "1000", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(out / "corpus_text_document")


def tail(text: str, n: int = 60) -> str:
    return "\n".join(text.splitlines()[-n:])


class LiveRun:
    """A pretrain run whose output is read while it runs, so a test can signal it at a chosen moment.

    ``signal`` reaches the launcher (or warm agent) and every rank under it at once, as a dying node or
    a scheduler's SIGTERM would.
    """

    def __init__(self, args: list[str], nproc: int = 1, env: dict | None = None, script: str = "pretrain_gpt.py",
                 warm: bool = True):
        import queue

        self.proc = start(str(ROOT / script), args, nproc=nproc, env=base_env(env), warm=warm, merge_stderr=True)
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 300) -> str:
        """The first output line matching ``pattern``; fails if the run ends or ``timeout`` passes first."""
        import queue
        import time

        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.signal(9)
                raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{tail(''.join(self.lines))}")
            if line is None:
                raise AssertionError(f"run ended before {pattern!r}:\n{tail(''.join(self.lines))}")
            self.lines.append(line)
            if regex.search(line):
                return line

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float = 300) -> Run:
        self.proc.wait(timeout=timeout)
        while True:
            line = self._queue.get(timeout=timeout)
            if line is None:
                break
            self.lines.append(line)
        return record(self.proc, "".join(self.lines), "")


class SharedRuns:
    """Runs that several tests compare against, made once per session and shared read-only.

    ``run(args, nproc, env)`` returns the same :class:`Run` for the same command line, whichever test
    asks first (the others wait for it). Only for runs that write nothing a test reads (no --save).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple, Future] = {}

    def run(self, args: list[str], nproc: int = 1, env: dict | None = None) -> Run:
        assert "--save" not in args, "a shared run must not write a checkpoint that one test could change"
        key = (tuple(args), nproc, tuple(sorted((env or {}).items())))
        with self._lock:
            future = self._runs.get(key)
            owner = future is None
            if owner:
                future = self._runs[key] = Future()
        if owner:
            try:
                future.set_result(run_pretrain(list(args), nproc=nproc, env=env))
            except BaseException as exc:  # noqa: BLE001  (raised to every test that asks)
                future.set_exception(exc)
        return future.result()


SHARED_RUNS = SharedRuns()
