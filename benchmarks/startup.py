"""Where a training process's first seconds go, phase by phase, beside a bare Megatron import.

    python benchmarks/startup.py [--repeats 3] [--json out.json]

One process, ``OMP_NUM_THREADS=1``, the tiny Qwen3 on mock data for one iteration; every figure is the
median of ``--repeats`` fresh processes, measured in the same run, so rows compare with each other:

* interpreter: ``python -c pass``;
* ``import torch``; megatron-core and its training package with the GPT model (a bare Megatron
  process pays these too); then ``import adaptor`` (our features registered, patches applied);
* inside ``pretrain()``: arguments parsed and validated, process groups, the rest of Megatron's
  initialisation (seeds, JIT warm-up), model and optimizer, data iterators, the first step;
* the same phases read from ``import adaptor`` against a bare ``import megatron.training`` and GPT model;
* the time until the one-line error of a misspelt flag, a missing dataset and an unwritable ``--save``;
* ``tools/preprocess_data.py`` start-up: a one-document input with a ``tokenizer.json``;
* the other tools that read files only: ``safetensors_ckpt.py info`` on the tiny model's checkpoint,
  a library import (``import adaptor.checkpoint.files``: no run set up), ``gen_docs.py --check``.

The probe (``--probe``) times the phases in-process by wrapping Megatron's functions for the length
of the run; it changes no computation.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_QWEN3 = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "192",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--kv-channels", "32", "--qk-layernorm", "--normalization", "RMSNorm", "--swiglu",
    "--disable-bias-linear", "--position-embedding-type", "rope", "--rotary-base", "1000000",
    "--seq-length", "64", "--max-position-embeddings", "64", "--attention-dropout", "0", "--hidden-dropout", "0",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3", "--seed", "1234",
    "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "512", "--train-iters", "1",
]
PHASES = ("interpreter", "import torch", "import megatron (core, training, GPT model)",
          "import adaptor (features, patches)", "entry file imports, arguments parsed and validated", "process groups",
          "rest of Megatron's initialisation", "model and optimizer", "data iterators", "first step")


def probe(argv: list[str]) -> None:
    """Run pretrain_gpt.py in this process and print each phase's end as ``PHASE name seconds``."""
    marks = {"start": time.perf_counter()}
    import torch  # noqa: F401

    marks["import torch"] = time.perf_counter()
    import megatron.core.models.gpt  # noqa: F401
    import megatron.training  # noqa: F401
    import megatron.training.training as training
    import megatron.training.initialize as initialize

    marks["import megatron (core, training, GPT model)"] = time.perf_counter()
    sys.argv = [str(ROOT / "pretrain_gpt.py"), *argv]
    sys.path[0] = str(ROOT)
    import adaptor  # noqa: F401

    marks["import adaptor (features, patches)"] = time.perf_counter()

    def timed(module, name, before=None, after=None, once=True):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            if before and before not in marks:
                marks[before] = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if after and (after not in marks or not once):
                    marks.setdefault(after, time.perf_counter())
        setattr(module, name, wrapper)

    timed(initialize, "_initialize_distributed", before="entry file imports, arguments parsed and validated", after="process groups")
    timed(training, "initialize_megatron", after="rest of Megatron's initialisation")
    timed(training, "setup_model_and_optimizer", after="model and optimizer")
    timed(training, "build_train_valid_test_data_iterators", after="data iterators")
    timed(training, "train_step", after="first step")
    import runpy

    try:
        runpy.run_path(str(ROOT / "pretrain_gpt.py"), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    previous = marks["start"]
    for phase in PHASES[1:]:
        print(f"PHASE {phase}\t{marks[phase] - previous:.4f}", flush=True)
        previous = marks[phase]


def env_one_thread(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", ADAPTOR_BACKEND=os.environ.get("ADAPTOR_BACKEND", "cpu"),
               PYTHONUNBUFFERED="1", **extra)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def wall(cmd: list[str], env: dict | None = None, cwd=ROOT, want: str | None = None) -> tuple[float, str]:
    """Seconds from start to exit (or to the first output line containing ``want``), and the output."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or env_one_thread(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if want and seen is None and want in line:
            seen = time.perf_counter() - start
    proc.wait()
    return (seen if seen is not None else time.perf_counter() - start), "".join(lines)


def median_of(repeats: int, measure) -> float:
    return statistics.median(measure() for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--probe", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe is not None:
        probe(args.probe)
        return
    py = sys.executable
    rows: dict[str, float] = {}

    def phases() -> dict[str, float]:
        seconds, out = wall([py, str(Path(__file__).resolve()), "--probe", *TINY_QWEN3, "--mock-data"])
        found = {line.split("\t")[0][6:]: float(line.split("\t")[1])
                 for line in out.splitlines() if line.startswith("PHASE ")}
        if len(found) != len(PHASES) - 1:
            raise SystemExit(f"the probe run failed:\n{out[-3000:]}")
        found["whole run (wall)"] = seconds
        return found

    runs = [phases() for _ in range(args.repeats)]
    rows["interpreter"] = median_of(args.repeats, lambda: wall([py, "-c", "pass"])[0])
    for key in runs[0]:
        rows[key] = statistics.median(run[key] for run in runs)

    bare = "import megatron.training, megatron.training.training, megatron.core.models.gpt"
    pairs = []
    for _ in range(args.repeats):  # interleaved, so both see the same machine
        pairs.append((wall([py, "-c", bare])[0], wall([py, "-c", "import adaptor"])[0]))
    rows["bare: python -c 'import megatron.training (+ GPT model)'"] = statistics.median(p[0] for p in pairs)
    rows["ours: python -c 'import adaptor'"] = statistics.median(p[1] for p in pairs)
    rows["import adaptor / bare megatron"] = statistics.median(p[1] / p[0] for p in pairs)

    script = str(ROOT / "pretrain_gpt.py")
    rows["first error line: misspelt flag (--lr-decay-stile)"] = median_of(args.repeats, lambda: wall(
        [py, script, *TINY_QWEN3, "--mock-data", "--lr-decay-stile", "cosine"], want="error")[0])
    rows["first error line: missing --data-path"] = median_of(args.repeats, lambda: wall(
        [py, script, *TINY_QWEN3, "--data-path", "/nonexistent/corpus"], want="error:")[0])
    with tempfile.NamedTemporaryFile() as regular_file:
        rows["first error line: --save is a regular file"] = median_of(args.repeats, lambda: wall(
            [py, script, *TINY_QWEN3, "--mock-data", "--save", regular_file.name], want="error:")[0])

    with tempfile.TemporaryDirectory() as tmp:
        doc = Path(tmp) / "one.jsonl"
        doc.write_text(json.dumps({"text": "one short document"}) + "\n")
        tool = [py, str(ROOT / "tools" / "preprocess_data.py"), "--input", str(doc), "--output-prefix",
                str(Path(tmp) / "out"), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                str(ROOT / "examples" / "data" / "tokenizer"), "--append-eod", "--workers", "1"]
        rows["tools/preprocess_data.py, one document, tokenizer.json"] = median_of(
            args.repeats, lambda: wall(tool, env=env_one_thread())[0])
        save = Path(tmp) / "ckpt"
        _, out = wall([py, script, *TINY_QWEN3, "--mock-data", "--save", str(save), "--save-interval", "1",
                       "--ckpt-format", "safetensors"])
        if not (save / "latest_checkpointed_iteration.txt").is_file():
            raise SystemExit(f"the run that saves a checkpoint failed:\n{out[-3000:]}")
        info = [py, str(ROOT / "tools" / "safetensors_ckpt.py"), "info", "--load-dir", str(save)]
        rows["tools/safetensors_ckpt.py info, tiny model's checkpoint"] = median_of(
            args.repeats, lambda: wall(info, want="iteration 1")[0])
    rows["library: python -c 'import adaptor.checkpoint.files'"] = median_of(
        args.repeats, lambda: wall([py, "-c", "import adaptor.checkpoint.files"])[0])
    rows["tools/gen_docs.py --check (the reference page imports the features)"] = median_of(
        args.repeats, lambda: wall([py, str(ROOT / "tools" / "gen_docs.py"), "--check"])[0])

    import torch

    print(f"Device: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python "
          f"{platform.python_version()}, torch {torch.__version__}; {date.today()}; median of {args.repeats}")
    print("| what | seconds |\n|---|---|")
    for key, value in rows.items():
        unit = "x" if key.endswith("bare megatron") else ""
        print(f"| {key} | {value:.2f}{unit} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
