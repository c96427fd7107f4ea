"""Megatron-LM's functional-test command lines, scaled to two CPU ranks and run through pretrain_gpt.py.

    python tools/megatron_cases/run.py gpt/gpt3_mcore_te_tp2_pp2_resume_torch_dist [...]
    python tools/megatron_cases/run.py --all --out benchmarks/results/megatron_cases.json

The cases are those of ``cases.json`` (``extract.py``). Each keeps every flag of Megatron's own test
except what a 2-core CPU cannot hold; :func:`scale` changes those and records each change:

* sizes: layers, hidden, heads, query groups, FFN, experts, MLA/linear-attention/indexer dims;
* batch (micro 1, global 4), iterations (16), sequence (64), evaluation (1 batch at the end);
* parallel sizes: the world is 2 ranks; one of TP/PP/CP keeps 2 (TP first, PP first where the case is
  interleaved), EP keeps 2 where the expert grid allows (ETP drops to 1 first);
* data and tokenizer: the repository's sample corpus and tokenizer (``--mock-data`` cases keep mock
  data, with a 512-token vocabulary; ``--fim-data`` cases get the tokenizer with the FIM tokens
  added); ``${...}`` paths: folders under the work folder.

Outcomes: ``trains`` (every iteration logged, finite, and the mean loss of the last four iterations
below every loss of the first four: each batch is new, and batches differ by a few hundredths at
these sizes, so one loss against another says little), ``checks pass`` (a case whose AFTER_SCRIPT
judges it by its log, as the rerun state machine's cases are: every check holds, with the exit code
it asks for), ``loss flat`` (every iteration logged and finite, but no such fall), ``refused``
(one ``megatron-adaptor: error:`` line; the reason is the first flag it names), ``traceback`` (any
other failure: a defect), ``needs another host`` (a check that holds only when the job is resumed
on another node or device: :data:`NEEDS_ANOTHER_HOST`), ``not pretraining`` (inference and RL
cases: another entry file serves them; a case with no command line runs a script of its own). 
A ``ckpt-resume`` or ``frozen-resume`` case trains twice, as Megatron's CI does: 16 iterations
saving at 8 and 16, then iteration 16's checkpoint is removed and the same command resumes from 8;
the resumed iterations 9 to 16 must log the very losses of the first leg. A command line is checked
before torch is imported (``adaptor/command_line/early_check.py``), so a refusal costs a fraction of
a second; cases whose scaled command lines are identical run once.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CASES = Path(__file__).with_name("cases.json")
CORPUS = ROOT / "examples" / "data" / "sample_corpus.jsonl"
TOKENIZER = ROOT / "examples" / "data" / "tokenizer"
ITERS = 16
QUARTER = ITERS // 4  # a fall counts when the last quarter averages below each loss of the first
NOT_PRETRAINING = ("inference and RL, not pretraining: inference.py generates (greedy, sampling, beam search, chat; "
                   "MindSpeed-LLM's flags rather than Megatron's inference examples'), evaluation.py scores with "
                   "lm-eval; RL is not built yet")
OWN_SCRIPT = "no command line: the case runs its own {} instead of a training command"
RESUME_TYPES = ("ckpt-resume", "frozen-resume")
OUTCOMES = ("trains", "checks pass", "loss flat", "refused", "traceback", "needs another host", "not pretraining")

# Sizes a 2-core CPU holds. A flag absent from the case stays absent.
SIZES = {
    "--num-layers": "4", "--hidden-size": "64", "--ffn-hidden-size": "128", "--num-attention-heads": "4",
    "--num-query-groups": "2", "--kv-channels": "16", "--num-experts": "4", "--moe-ffn-hidden-size": "32",
    "--moe-shared-expert-intermediate-size": "32", "--moe-router-num-groups": "2", "--moe-router-group-topk": "1",
    "--q-lora-rank": "32", "--kv-lora-rank": "24", "--qk-head-dim": "16", "--qk-pos-emb-head-dim": "8",
    "--v-head-dim": "16", "--linear-num-key-heads": "2", "--linear-num-value-heads": "4",
    "--linear-key-head-dim": "16", "--linear-value-head-dim": "16", "--dsa-indexer-n-heads": "2",
    "--dsa-indexer-head-dim": "16", "--dsa-indexer-topk": "32", "--mup-base-hidden-size": "32",
    "--seq-length": "64", "--max-position-embeddings": "64", "--micro-batch-size": "1",
    "--global-batch-size": "4", "--train-iters": str(ITERS), "--log-interval": "1",
    "--microbatch-group-size-per-virtual-pipeline-stage": "2", "--eval-global-batch-size": "4",
    "--mtp-num-layers": "1", "--num-workers": "1",
}
# Schedules counted in iterations or samples follow the shorter run.
SCHEDULE = {"--lr-decay-iters": str(ITERS), "--lr-warmup-iters": "1", "--train-samples": str(ITERS * 4),
            "--lr-decay-samples": str(ITERS * 4), "--lr-warmup-samples": "4", "--exit-interval": str(ITERS)}
DROPPED = ("--rampup-batch-size", "--step-batch-size-schedule", "--exit-duration-in-mins", "--vocab-file",
           "--merge-file", "--tokenizer-model", "--data-args-path", "--per-split-data-args-path")
PARALLEL = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
            "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
            "etp": "--expert-tensor-parallel-size"}


class CommandLine:
    """A command line as an ordered list of (flag, values), edited with a record of every change."""

    def __init__(self, argv: list[str]):
        self.items: list[list] = []
        for token in argv:
            if token.startswith("--"):
                self.items.append([token, []])
            else:
                self.items[-1][1].append(token)
        self.changes: list[str] = []

    def get(self, flag: str, default=None):
        for f, values in self.items:
            if f == flag:
                return " ".join(values) if values else True
        return default

    def set(self, flag: str, value: str, why: str = "") -> None:
        for item in self.items:
            if item[0] == flag:
                old = " ".join(item[1])
                if old != value:
                    item[1] = value.split(" ") if flag != "--pipeline-model-parallel-layout" else [value]
                    self.changes.append(f"changed {flag} from {old} to {value}{why}")
                return
        self.items.append([flag, value.split(" ")])
        self.changes.append(f"added {flag} {value}{why}")

    def drop(self, flag: str, why: str = "") -> None:
        if any(f == flag for f, _ in self.items):
            self.items = [item for item in self.items if item[0] != flag]
            self.changes.append(f"dropped {flag}{why}")

    def argv(self) -> list[str]:
        return [token for flag, values in self.items for token in (flag, *values)]


def _int(value, default: int = 1) -> int:
    return default if value in (None, True) else int(value)


def scale_parallel(cmd: CommandLine) -> None:
    """Fit TP x PP x CP (and the expert grid EP x ETP per stage) into 2 ranks, keeping one of them 2."""
    size = {k: _int(cmd.get(flag)) for k, flag in PARALLEL.items() if k != "etp"}
    interleaved = any(cmd.get(f) for f in ("--num-layers-per-virtual-pipeline-stage",
                                           "--num-virtual-stages-per-pipeline-rank"))
    order = ("pp", "tp", "cp") if interleaved else ("tp", "pp", "cp")

    def layout(kept):
        new = {k: (2 if k == kept else 1) for k in order}
        etp = min(_int(cmd.get(PARALLEL["etp"]), new["tp"]), 2)
        ep = min(size["ep"], 2)
        if new["pp"] * ep * etp > 2 and etp > 1:
            etp = 1  # expert parallelism before expert tensor parallelism
        if new["pp"] * ep * etp > 2:
            ep = 1
        return new, ep, etp

    # The dimension kept at 2 is the one that leaves the most dimensions parallel (EP counts).
    candidates = [k for k in order if size[k] > 1] or [None]
    kept = max(candidates, key=lambda k: sum(v > 1 for v in (*layout(k)[0].values(), layout(k)[1])))
    new, ep, etp = layout(kept)
    new["ep"], new["etp"] = ep, etp
    for k, flag in PARALLEL.items():
        if cmd.get(flag) is not None:
            cmd.set(flag, str(new[k]), " (2 ranks)")
        elif k == "etp" and etp != new["tp"]:
            cmd.set(flag, str(etp), " (ETP defaults to TP; the expert grid holds EP 2 only with ETP 1)")
    if new["cp"] != size["cp"]:
        cmd.drop("--hierarchical-context-parallel-sizes", " (CP reduced)")
        if new["cp"] == 1:
            cmd.drop("--cp-comm-type", " (no CP)")
    dp = 2 // (new["tp"] * new["pp"] * new["cp"])
    instances = cmd.get("--num-distributed-optimizer-instances")
    if instances is not None and _int(instances) > dp:
        cmd.set("--num-distributed-optimizer-instances", str(dp), f" (data-parallel size {dp})")


def scale_layers(cmd: CommandLine) -> None:
    """4 layers (5 or 6 where the pipeline split counts embedding/loss), split as the case splits them."""
    pp = _int(cmd.get("--pipeline-model-parallel-size"))
    if pp == 1:
        for flag in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                     "--microbatch-group-size-per-virtual-pipeline-stage", "--pipeline-model-parallel-layout"):
            cmd.drop(flag, " (no pipeline)")
    if cmd.get("--num-layers-per-virtual-pipeline-stage") is not None:
        cmd.set("--num-layers-per-virtual-pipeline-stage", "1")
    vpp = 2 if cmd.get("--num-virtual-stages-per-pipeline-rank") is not None else 1
    if vpp > 1:
        cmd.set("--num-virtual-stages-per-pipeline-rank", "2")
    if cmd.get("--num-layers-per-virtual-pipeline-stage") is not None and pp > 1:
        vpp = 2
    extra = bool(cmd.get("--account-for-embedding-in-pipeline-split")) + bool(
        cmd.get("--account-for-loss-in-pipeline-split"))
    layers = 4
    while (layers + extra) % (pp * vpp):
        layers += 1
    layout = cmd.get("--pipeline-model-parallel-layout")
    if isinstance(layout, str):
        stages = [["t"] * (layers // (pp * vpp)) for _ in range(pp * vpp)]
        stages[0].insert(0, "E")
        stages[-1] += ["m"] * ("m" in layout) + ["L"]
        cmd.set("--pipeline-model-parallel-layout", "|".join("".join(s) for s in stages))
    if cmd.get("--num-layers") is not None:
        cmd.set("--num-layers", str(layers))
    first, last = cmd.get("--decoder-first-pipeline-num-layers"), cmd.get("--decoder-last-pipeline-num-layers")
    if first is not None and last is not None and pp == 2:
        cmd.set("--decoder-first-pipeline-num-layers", "1")
        cmd.set("--decoder-last-pipeline-num-layers", str(layers - 1))
    elif pp == 1:
        cmd.drop("--decoder-first-pipeline-num-layers", " (no pipeline)")
        cmd.drop("--decoder-last-pipeline-num-layers", " (no pipeline)")
    else:
        for flag in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
            if cmd.get(flag) is not None:
                cmd.set(flag, "1")
    freq = cmd.get("--moe-layer-freq")
    if isinstance(freq, str) and "[" in freq:
        dense_first = freq.replace(" ", "").lstrip("(").startswith("[0]")
        cmd.set("--moe-layer-freq", f"([0]*1+[1]*{layers - 1})" if dense_first else f"([1]*{layers})")


def scale_sizes(cmd: CommandLine) -> None:
    for flag, value in {**SIZES, **SCHEDULE}.items():
        # the layer count is scale_layers' (a pipeline split may need more than 4)
        if cmd.get(flag) not in (None, "0") and flag not in ("--train-iters", "--log-interval", "--num-layers"):
            cmd.set(flag, value)
    if cmd.get("--train-samples") is None:
        cmd.set("--train-iters", str(ITERS))
    if cmd.get("--global-batch-size") is None:  # Megatron's default, micro x DP, is 1 micro-batch here
        cmd.set("--global-batch-size", "4")
    cmd.set("--log-interval", "1", " (each iteration's loss is read)")
    topk = cmd.get("--moe-router-topk")
    if topk is not None and _int(topk) > 2:
        cmd.set("--moe-router-topk", "2")
    if cmd.get("--eval-iters") not in (None, "0"):
        cmd.set("--eval-iters", "1")
    if cmd.get("--eval-interval") is not None:
        cmd.set("--eval-interval", str(ITERS))
    for flag in DROPPED:
        cmd.drop(flag)


def scale_data(cmd: CommandLine, corpus_prefix: str) -> None:
    if cmd.get("--mock-data"):
        cmd.drop("--data-path", " (mock data)")
        cmd.set("--tokenizer-type", "NullTokenizer")
        cmd.set("--vocab-size", "512")
        return
    cmd.drop("--vocab-size")
    cmd.set("--data-path", corpus_prefix, " (the sample corpus)")
    cmd.set("--tokenizer-type", "HuggingFaceTokenizer")
    if cmd.get("--fim-data"):
        cmd.set("--tokenizer-model", str(Path(corpus_prefix).parent / FIM_TOKENIZER),
                " (the sample tokenizer with Megatron's default fill-in-the-middle tokens added)")
    else:
        cmd.set("--tokenizer-model", str(TOKENIZER))
    if cmd.get("--split") is None:
        cmd.set("--split", "99,1,0")


def scale(argv: list[str], test_type: str, corpus_prefix: str) -> tuple[list[str], list[str]]:
    """The case's command line for 2 CPU ranks, and the list of changes made."""
    cmd = CommandLine(argv)
    scale_parallel(cmd)
    scale_layers(cmd)
    scale_sizes(cmd)
    scale_data(cmd, corpus_prefix)
    if cmd.get("--fp16") and cmd.get("--initial-loss-scale") is None and cmd.get("--loss-scale") is None:
        cmd.set("--initial-loss-scale", "4096", " (fp16 from 2^32 skips an iteration per halving: up to 16 before it fits)")
    if test_type in RESUME_TYPES:
        cmd.set("--save-interval", str(ITERS // 2), " (the resumed leg starts there)")
        if cmd.get("--save") is None:
            cmd.set("--save", "${CHECKPOINT_SAVE_PATH}")
        cmd.set("--load", "${CHECKPOINT_SAVE_PATH}", " (the first leg's checkpoints)")
    elif cmd.get("--save") is not None:
        cmd.set("--save-interval", str(ITERS))
    if cmd.get("--save-retain-interval") is not None and cmd.get("--save-interval") is not None:
        # Megatron asks for a multiple of --save-interval
        cmd.set("--save-retain-interval", cmd.get("--save-interval"), " (a multiple of --save-interval)")
    if any(flag.startswith("--wandb-") for flag, *_ in cmd.items):
        cmd.changes.append("environment WANDB_MODE=offline (no network here: Weights & Biases writes its run locally)")
    if test_type in ("frozen-start", "frozen-resume", "release") and cmd.get("--load") is not None:
        cmd.changes.append("note: Megatron's stored checkpoint is not here: --load names an empty folder")
    return cmd.argv(), cmd.changes


# --- running -----------------------------------------------------------------------------------

ERROR = "megatron-adaptor: error:"
LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?lm loss: ([0-9.Ee+-]+|nan|inf)")


def corpus(work: Path) -> str:
    """The sample corpus tokenized once with the sample tokenizer; its Megatron dataset prefix."""
    prefix = work / "corpus" / "sample"
    if not Path(f"{prefix}_text_document.idx").exists():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(ROOT / "tools" / "preprocess_data.py"), "--input", str(CORPUS),
                        "--output-prefix", str(prefix), "--tokenizer-type", "HuggingFaceTokenizer",
                        "--tokenizer-model", str(TOKENIZER), "--append-eod", "--workers", "1"],
                       check=True, capture_output=True)
    fim_tokenizer(prefix.parent / FIM_TOKENIZER)
    return f"{prefix}_text_document"


FIM_TOKENIZER = "fim_tokenizer"
FIM_TOKENS = ("<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>")  # Megatron's --fim-*-token defaults


def fim_tokenizer(folder: Path) -> Path:
    """The sample tokenizer with Megatron's default FIM tokens added as special tokens after its
    vocabulary (ids 1436-1439): the corpus's ids are unchanged, and ``--fim-data`` finds its tokens."""
    from tokenizers import AddedToken, Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in FIM_TOKENS])
    tokenizer.save(str(folder / "tokenizer.json"))
    shutil.copy(TOKENIZER / "tokenizer_config.json", folder / "tokenizer_config.json")
    return folder


def placeholders(argv: list[str], folder: Path) -> list[str]:
    """``${NAME}`` -> a folder per name under ``folder`` (``${REPEAT}``, Megatron's repeat index: 1)."""
    def sub(match):
        if match.group(1) == "REPEAT":
            return "1"
        path = folder / match.group(1).lower()
        path.mkdir(parents=True, exist_ok=True)
        return str(path)
    return [re.sub(r"\$\{(\w+)\}", sub, token) for token in argv]


def env() -> dict:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    out.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ADAPTOR_BACKEND=out.get("ADAPTOR_BACKEND", "cpu"),
               WANDB_MODE="offline", WANDB_SILENT="true")
    return out


def early_refusal(argv: list[str]) -> str | None:
    """The one line the early check answers ``argv`` with (before torch), or None if it passes."""
    code = ("import sys; from adaptor.command_line.early_check import check; "
            "sys.argv = ['pretrain_gpt.py'] + sys.argv[1:]; check(sys.argv[1:])")
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**env(), "WORLD_SIZE": "2"})
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith(ERROR)]
    return lines[0] if proc.returncode and lines else None


def torchrun(argv: list[str], timeout: float) -> tuple[int, str]:
    from adaptor.env import torchrun_command  # ADAPTOR_TORCHRUN, else this interpreter's torchrun
    from adaptor.rendezvous import rendezvous_port

    command = [*torchrun_command(), "--nproc-per-node", "2", "--master-port",
               str(rendezvous_port()), str(ROOT / "pretrain_gpt.py"), *argv]
    # Output goes to a file, not a pipe: a process a rank leaves behind (a checkpoint worker, a
    # multiprocessing manager) would hold a pipe open and the read would never end. Every process of
    # the launch carries a token in its environment, and whatever is left is ended afterwards.
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                env={**env(), "MEGATRON_CASES_LAUNCH": token}, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = ""
        except subprocess.TimeoutExpired:
            rc, timed_out = 124, f"\nTimeoutError: no exit within {timeout} s"
        _end_launch(proc, token)
        log.seek(0)
        return rc, log.read() + timed_out


def _end_launch(proc: subprocess.Popen, token: str) -> None:
    """Kill the launch's process group and any process that carries its token (ranks a warm launcher forked)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    marker = f"MEGATRON_CASES_LAUNCH={token}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue


def losses(output: str) -> dict[int, float]:
    return {int(i): float(v) for i, v in LOSS.findall(output)}


def failure_line(output: str) -> str:
    """A failed run's reason: its one-line error, else the exception's last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(ERROR):
            return line
    for line in reversed(lines):  # the ranks' exception, not the launcher's ChildFailedError after it
        if re.match(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception|Interrupt)\b", line) and "ChildFailed" not in line:
            return line
    return lines[-1] if lines else "(no output)"


def flag_named(line: str) -> str:
    match = re.search(r"--[a-z0-9][a-z0-9_-]*", line[len(ERROR):])
    return match.group(0) if match else line[len(ERROR):].strip()[:60]


def falls(curve: list[float]) -> bool:
    """The last quarter of the curve averages below every loss of its first quarter."""
    return sum(curve[-QUARTER:]) / QUARTER < min(curve[:QUARTER])


def judge(rc: int, output: str, iters: range) -> dict:
    got = losses(output)
    if rc == 0 and sorted(got) == list(iters) and all(math.isfinite(v) for v in got.values()):
        curve = [got[i] for i in iters]
        if falls(curve):
            return {"outcome": "trains", "losses": curve}
        return {"outcome": "loss flat", "reason": f"loss did not fall in {len(curve)} iterations: {curve}",
                "losses": curve}
    line = failure_line(output)
    if line.startswith(ERROR):
        return {"outcome": "refused", "reason": flag_named(line), "line": line}
    if rc == 0:
        line = f"exit 0 but losses {got} for iterations {list(iters)}"
    trained = [got[i] for i in sorted(got)]  # how far it trained before failing
    return {"outcome": "traceback", "reason": line, "losses_before": trained, "tail": output.splitlines()[-40:]}


# Checks of core_r0.19.0's AFTER_SCRIPTs that no longer match the messages of the megatron-core they
# run with (the same branch's megatron/core/rerun_state_machine.py and megatron/training/training.py):
# the same event, in the words megatron-core 0.19.2 prints it.
UPDATED_CHECKS = {
    # training.py, setting the rerun state machine's iteration: "Overwriting ... from {old} to {new}..."
    "Setting rerun_state_machine.current_iteration to 0...": (
        False, "Overwriting rerun_state_machine.current_iteration from -1 to 0..."),
    # RerunStateMachine.validate_result.log_failure: "Rank r, node n, device d, iteration #i: message!"
    r"ERROR:megatron\.core\.rerun_state_machine:Rank [0-9]+, node ([0-9a-z]|\-)+, device [0-9]+: Possible transient error!!": (
        True, r"ERROR:megatron\.core\.rerun_state_machine:Rank [0-9]+, node ([0-9a-z]|\-)+, device [0-9]+, iteration #[0-9]+: Possible transient error!!"),
    r"ERROR:megatron\.core\.rerun_state_machine:Rank [0-9]+, node ([0-9a-z]|\-)+, device [0-9]+: Possible persistent error!!": (
        True, r"ERROR:megatron\.core\.rerun_state_machine:Rank [0-9]+, node ([0-9a-z]|\-)+, device [0-9]+, iteration #[0-9]+: Possible persistent error!!"),
}


def check_holds(check: dict, output: str) -> bool:
    regex, pattern = UPDATED_CHECKS.get(check["pattern"], (check["regex"], check["pattern"]))
    return bool(re.search(pattern, output) if regex else pattern in output) == check["present"]


def judge_by_log(rc: int, output: str, checks: list[dict], exit_code_ignored: bool) -> dict:
    """A case whose AFTER_SCRIPT judges it, as Megatron's CI does: every log check holds (and the exit
    code is 0 unless the script ignores it)."""
    line = failure_line(output)
    if rc and line.startswith(ERROR):
        return {"outcome": "refused", "reason": flag_named(line), "line": line}
    failed = [c["pattern"] for c in checks if not check_holds(c, output)]
    if failed or (rc and not exit_code_ignored):
        why = line if rc else ""
        if failed:  # and, where the run failed, the failure that kept the message from the log
            why = f"log check failed: {failed[0]!r}" + (f" (exit {rc}: {line})" if rc else "")
        return {"outcome": "traceback", "reason": why, "exit_code": rc, "tail": output.splitlines()[-40:]}
    got = losses(output)
    return {"outcome": "checks pass", "exit_code": rc, "checks": len(checks), "losses": [got[i] for i in sorted(got)]}


def refused_early(line: str) -> dict:
    return {"outcome": "refused", "reason": flag_named(line), "line": line, "early": True}


def check_early(argv: list[str], work: Path) -> str | None:
    folder = Path(tempfile.mkdtemp(prefix="check-", dir=work))
    try:
        return early_refusal(placeholders(argv, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_case(argv: list[str], test_type: str, work: Path, timeout: float, case: dict | None = None,
             stored: list[str] | None = None) -> dict:
    """Run one scaled command line (both legs for a resume case) and judge it: by its log checks where
    Megatron's case has them, else by its losses. ``stored``: a command line that first writes the
    checkpoint the case loads (``${CHECKPOINT_LOAD_PATH}``)."""
    folder = Path(tempfile.mkdtemp(prefix="case-", dir=work))
    try:
        concrete = placeholders(argv, folder)
        refusal = early_refusal(concrete)
        if refusal:
            return refused_early(refusal)
        if stored:
            rc, output = torchrun(placeholders(stored, folder), timeout)
            if not (folder / "checkpoint_load_path" / "latest_checkpointed_iteration.txt").is_file():
                return {"outcome": "traceback", "reason": f"stored checkpoint: {failure_line(output)}",
                        "tail": output.splitlines()[-40:]}
        rc, output = torchrun(concrete, timeout)
        if case and case.get("log_checks") and test_type not in RESUME_TYPES:
            return judge_by_log(rc, output, case["log_checks"], case.get("exit_code_ignored", False))
        first = judge(rc, output, range(1, ITERS + 1))
        if test_type not in RESUME_TYPES or first["outcome"] not in ("trains", "loss flat"):
            return first
        save = folder / "checkpoint_save_path"
        shutil.rmtree(save / f"iter_{ITERS:07d}", ignore_errors=True)
        (save / "latest_checkpointed_iteration.txt").write_text(str(ITERS // 2))
        rc, output = torchrun(concrete, timeout)
        second = judge(rc, output, range(ITERS // 2 + 1, ITERS + 1))
        if second["outcome"] == "refused" or (second["outcome"] == "traceback" and "losses" not in second):
            second["reason"] = f"resume: {second['reason']}"
            return second
        resumed = losses(output)
        expected = first["losses"][ITERS // 2:]
        got = [resumed.get(i) for i in range(ITERS // 2 + 1, ITERS + 1)]
        if got != expected:
            return {"outcome": "traceback", "reason": f"resume differs: {got} != {expected}",
                    "losses": first["losses"]}
        return {**first, "resumed": got}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# Frozen-start cases judged by what they log on loading Megatron's stored checkpoint, which is not
# here: the case (or own command) whose run writes a checkpoint of that kind. The reshard case loads
# the checkpoint the persistent-error case saves on exiting to rerun elsewhere (exit 16), at another
# layout (TP2 here, PP2 there), which Megatron's distributed optimizer reads only from its fully
# reshardable layout. (The persistent-error case's own second run would load it too, on another host.)
STORED_BY = {"gpt/gpt3_mcore_reruns_reshard": ("gpt/gpt3_mcore_reruns_persistent_1",
                                               ["--dist-ckpt-optim-fully-reshardable"]),
             "gpt/gpt3_mcore_reruns_resume": ("own", [])}


# Cases whose checks need what one host cannot be: the rerun state machine tells a persistent error
# from a transient one only when the job that resumes runs on another node or device than the one that
# saw the fault (RerunStateMachine.validate_result compares node name and device; here both are the same,
# so the resumed job exits 16 to be rescheduled again, as it should).
NEEDS_ANOTHER_HOST = {"gpt/gpt3_mcore_reruns_persistent_2"}


def stored_checkpoint(name: str, table: dict, prefix: str) -> list[str] | None:
    """The command line that writes the checkpoint case ``name`` loads, or None."""
    source, extra = STORED_BY.get(name, (None, []))
    if source is None:
        return None
    cmd = CommandLine(scale(table[name if source == "own" else source]["argv"], "regular", prefix)[0] + extra)
    cmd.set("--save", "${CHECKPOINT_LOAD_PATH}")
    cmd.drop("--load")
    if source == "own":  # the same schedule, stopped half-way
        cmd.set("--exit-interval", str(ITERS // 2))
        cmd.set("--save-interval", str(ITERS // 2))
    return cmd.argv()


def case_key(argv: list[str], case: dict) -> tuple:
    """Cases with this key are the same run: the same command line, legs and log checks."""
    return tuple(argv), case["test_type"] in RESUME_TYPES, json.dumps(case.get("log_checks"))


def run_cases(names: list[str], table: dict, work: Path, timeout: float, log=print, each=None) -> dict:
    """Each named case's result; identical scaled command lines run once. ``each(results)`` after each case."""
    prefix = corpus(work)
    done: dict[tuple, dict] = {}
    results = {}
    # First every command line's early check (a fraction of a second each), then the runs: refusals first.
    for name in names:
        case = table[name]
        if case["mode"] == "pretraining":
            argv, _ = scale(case["argv"], case["test_type"], prefix)
            key = case_key(argv, case)
            if key not in done and (line := check_early(argv, work)):
                done[key] = dict(refused_early(line), wall_s=0.0, first_of=name)
    names = sorted(names, key=lambda n: table[n]["mode"] == "pretraining" and case_key(
        scale(table[n]["argv"], table[n]["test_type"], prefix)[0], table[n]) not in done)
    for name in names:
        case = table[name]
        if case["mode"] == "own script":
            results[name] = {"outcome": "not pretraining", "reason": "own script",
                             "line": OWN_SCRIPT.format(", ".join(case["scripts"]))}
            continue
        if case["mode"] != "pretraining":
            results[name] = {"outcome": "not pretraining", "reason": case["mode"], "line": NOT_PRETRAINING}
            continue
        if name in NEEDS_ANOTHER_HOST:
            results[name] = {"outcome": "needs another host", "reason": "rescheduled on the same node and device"}
            log(f"{name}: {results[name]['outcome']}", flush=True)
            continue
        argv, changes = scale(case["argv"], case["test_type"], prefix)
        key = case_key(argv, case)
        started = time.monotonic()
        if key not in done:
            done[key] = run_case(argv, case["test_type"], work, timeout, case, stored_checkpoint(name, table, prefix))
            done[key]["wall_s"] = round(time.monotonic() - started, 1)
            done[key]["first_of"] = name
        result = dict(done[key], test_type=case["test_type"], changes=changes, argv=argv)
        if done[key]["first_of"] != name:
            result["same_command_as"] = done[key]["first_of"]
        results[name] = result
        log(f"{name}: {result['outcome']}  {result.get('reason', '')}  ({done[key]['wall_s']} s)", flush=True)
        if each:
            each(results)
    return results


# --- reports -----------------------------------------------------------------------------------

def grouped(results: dict) -> dict[str, dict[str, list[str]]]:
    """outcome -> reason -> case names (trains: one group)."""
    out: dict[str, dict[str, list[str]]] = {}
    for name, r in sorted(results.items()):
        reason = "" if r["outcome"] == "trains" else r.get("reason", "")
        out.setdefault(r["outcome"], {}).setdefault(reason, []).append(name)
    return out


def measured(record: dict) -> str:
    """When and at which commit: "2026-11-27 at abc (12 cases), 2026-11-26 at def (90 cases)"."""
    runs: dict[tuple, int] = {}
    for r in record["cases"].values():
        key = (r.get("date", record["date"][:10]), r.get("measured_at", record["measured_at"])[:12])
        runs[key] = runs.get(key, 0) + 1
    if len(runs) == 1:
        (date, commit), = runs
        return f"{date} at {commit}"
    return ", ".join(f"{d} at {c} ({n} cases)" for (d, c), n in sorted(runs.items(), reverse=True))


def table_markdown(record: dict) -> str:
    """The results as docs/migrating.md shows them: counts, then the cases by outcome and reason."""
    results = record["cases"]
    groups = grouped(results)
    count = {o: sum(map(len, g.values())) for o, g in groups.items()}
    lines = [f"Megatron-LM {record['megatron_lm']['branch']} ({record['megatron_lm']['commit'][:12]}): "
             f"{len(results)} of {record.get('total', len(results))} cases judged, measured {measured(record)}; "
             f"{record['cores']} CPU cores, 2 ranks each.", "",
             "| outcome | cases |", "|---|---|"]
    lines += [f"| {o} | {count[o]} |" for o in OUTCOMES if o in count]
    spans = collections.Counter(len(r["losses"]) for r in results.values()  # those judged by their curve
                                if r["outcome"] in ("trains", "loss flat"))
    if len(spans) > 1:  # measured under an earlier rule too
        lines += ["", "Launched cases by the iterations they were judged over: " + ", ".join(
            f"{n} over {iters}" for iters, n in sorted(spans.items(), reverse=True)) + f" (before the "
            f"{ITERS}-iteration rule, a case trained when its last loss was below its first)."]
    for outcome in OUTCOMES:
        if outcome not in groups:
            continue
        lines += ["", f"**{outcome}**", ""]
        for reason, names in sorted(groups[outcome].items(), key=lambda kv: (-len(kv[1]), kv[0])):
            cases = ", ".join(n.split("/", 1)[1] for n in names)
            lines.append(f"- {_md(reason) + ' ' if reason else ''}({len(names)}): {cases}")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    text = " ".join(str(text).split()).replace("`", "'")
    return f"`{text[:160]}`" if text else ""


def status_markdown(record: dict) -> str:
    """For whoever fixes them: every traceback with its last line, every refusal reason with a count."""
    groups = grouped(record["cases"])
    lines = [f"# Megatron-LM functional cases, {record['date']} (at {record['measured_at'][:12]})", ""]
    lines += [f"- {o}: {sum(map(len, g.values()))}" for o, g in sorted(groups.items())]
    lines += ["", "## Tracebacks (case: last line)", ""]
    for name, r in sorted(record["cases"].items()):
        if r["outcome"] == "traceback":
            lines.append(f"- {name}: {r['reason'][:300]}" + (
                f" (same command as {r['same_command_as']})" if r.get("same_command_as") else ""))
    lines += ["", "## Refusals by reason (flag: count; one line)", ""]
    for reason, names in sorted(groups.get("refused", {}).items(), key=lambda kv: -len(kv[1])):
        line = record["cases"][names[0]]["line"]
        lines.append(f"- {reason}: {len(names)}  -- {line[:300]}  [{', '.join(names[:4])}{' ...' if len(names) > 4 else ''}]")
    lines += ["", "## Trains", "", *[f"- {n}" for n in groups.get("trains", {}).get("", [])]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="case names, as in cases.json (gpt/NAME, moe/NAME)")
    parser.add_argument("--all", action="store_true", help="every case")
    parser.add_argument("--out", help="write the results here (JSON)")
    parser.add_argument("--work", help="folder for the corpus and each run's files (default: a temp folder)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per launch")
    parser.add_argument("--docs", action="store_true",
                        help="then regenerate docs/migrating.md's table (tools/gen_docs.py) from --out")
    parser.add_argument("--status", help="also write a Markdown summary here (tracebacks, refusals by reason)")
    parser.add_argument("--merge", action="store_true",
                        help="keep --out's other cases, each with the commit it was measured at")
    args = parser.parse_args()
    table = json.loads(CASES.read_text())
    unknown = [c for c in args.cases if c not in table["cases"]]
    if unknown or not (args.cases or args.all):
        parser.error(f"unknown case {unknown[0]}" if unknown else "name cases or pass --all")
    names = sorted(table["cases"]) if args.all else args.cases
    work = Path(args.work or tempfile.mkdtemp(prefix="megatron-cases-"))
    work.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    kept = {}
    if args.merge and args.out and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        kept = {name: {"measured_at": old["measured_at"], "date": old["date"][:10], **r}
                for name, r in old["cases"].items() if name not in names}

    def write(results: dict) -> None:
        if not args.out:
            return
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        cases = {**kept, **{name: {"measured_at": commit, "date": now[:10], **r} for name, r in results.items()}}
        record = {"megatron_lm": {"branch": table["branch"], "commit": table["commit"]},
                  "measured_at": commit, "date": now,
                  "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                  "total": len(table["cases"]), "cases": dict(sorted(cases.items()))}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        if args.status:
            Path(args.status).write_text(status_markdown(record))

    write(run_cases(names, table["cases"], work, args.timeout, each=write))
    if args.docs:
        subprocess.run([sys.executable, str(ROOT / "tools" / "gen_docs.py")], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
