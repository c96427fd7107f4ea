"""Bad command lines end with ONE clear error line and a non-zero exit.

Each case runs pretrain_gpt.py the way a user would (torchrun where the world
size matters, otherwise plain ``python`` with the single-process rendezvous
variables torchrun would set, so that a regression reaches Megatron's real
failure instead of a missing MASTER_ADDR) and checks:

* a non-zero exit status;
* exactly one line starting with ``megatron-adaptor: error:`` in stdout+stderr
  together, and it names the flag/value at fault;
* no Python traceback from the training process (see ``child_frames``);
* nothing written: ``--save`` points into an empty scratch directory that is
  also the working directory, and both stay empty; the directory holding the
  real half of a dataset blend keeps only its ``.bin``/``.idx``.

``test_control_same_shapes_train`` runs a good command line built from the same
pieces (real dataset, blend form, the head shapes of the TP case) so that the
failures above are known to come from the one bad value each case changes.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "pretrain_gpt.py")
PREFIX = "megatron-adaptor: error:"
TIMEOUT = 180

# The tiny Qwen3-shaped command line from the README, without its data flag.
TINY = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "32",
    "--ffn-hidden-size", "192", "--seq-length", "64", "--max-position-embeddings", "64",
    "--normalization", "RMSNorm", "--swiglu", "--qk-layernorm",
    "--position-embedding-type", "rope", "--rotary-base", "1000000", "--disable-bias-linear",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "2", "--lr", "1e-3",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
    "--attention-dropout", "0", "--hidden-dropout", "0",
    "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000",
]
MOCK = ["--mock-data"]
# Case b: 3 heads in 3 query groups; hidden 96 = 3 x 32 keeps every other
# shape consistent, so only "3 is not divisible by TP 2" is wrong.
THREE_HEADS = ["--num-attention-heads", "3", "--num-query-groups", "3", "--kv-channels", "32", "--hidden-size", "96"]


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    return str(Path(next(iter(spec.submodule_search_locations))).resolve())


MEGATRON_DIR = _package_dir("megatron")
TORCH_DISTRIBUTED_DIR = str(Path(_package_dir("torch")) / "distributed")

# A traceback frame, with or without the "[rankN]:" prefix torch adds to a
# worker's uncaught-exception output once its process group exists.
_FRAME = re.compile(r'^(?:\[rank\d+\]:)?\s*File "([^"]+)", line \d+', re.MULTILINE)


def child_frames(output: str) -> list[str]:
    """Traceback frames that come from the training process, not the launcher.

    When a worker fails, torchrun itself raises ChildFailedError and prints a
    "Traceback" whose frames all lie in torch/distributed (plus bin/torchrun
    or <frozen runpy>), so searching the output for the word "Traceback" cannot
    tell a launcher report from a crash. Neither can the "[rank0]:" prefix:
    torch adds it only after init_process_group, and argument errors happen
    before that, so a regression there would print an unprefixed traceback.
    What every traceback of the training process does have is a frame in
    pretrain_gpt.py (its entry point) and, for a failure inside Megatron, frames
    under site-packages/megatron; torchrun's report has neither. So: any frame
    in this repository or in megatron is a child traceback, whichever process
    printed it and whatever prefix it carries.
    """
    frames = []
    for path in _FRAME.findall(output):
        resolved = str(Path(path).resolve()) if not path.startswith("<") else path
        # A virtualenv may live inside the repository (.ci/run makes .venv there):
        # installed packages are not our code, megatron excepted.
        ours = resolved.startswith(str(ROOT)) and "site-packages" not in Path(resolved).parts
        if ours or resolved.startswith(MEGATRON_DIR):
            frames.append(path)
    return frames


def launcher_only_frames(output: str) -> bool:
    """Every frame printed lies in torchrun's own code (the ChildFailedError report)."""
    for path in _FRAME.findall(output):
        if path.startswith("<frozen "):
            continue
        resolved = str(Path(path).resolve())
        if not (resolved.startswith(TORCH_DISTRIBUTED_DIR) or Path(path).name == "torchrun"):
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ADAPTOR_BACKEND="cpu")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """subprocess.run with a timeout that also ends torchrun's workers.

    On timeout subprocess.run kills only its direct child; torchrun's workers
    would live on as orphans. The command gets its own session, and the whole
    process group is killed instead.
    """
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"no exit within {TIMEOUT} s: {' '.join(cmd)}\n{os.linesep.join((out + err).splitlines()[-60:])}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_torchrun(nproc: int, args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={free_port()}", SCRIPT, *args]
    return run(cmd, cwd, base_env(**env))


def run_python(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    """One process, with the variables torchrun --nproc_per_node 1 would set."""
    rendezvous = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return run([sys.executable, SCRIPT, *args], cwd, base_env(**rendezvous, **env))


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(PREFIX)]


def torchrun_root_cause(output: str) -> tuple[int, int] | None:
    """(rank, exitcode) of the "Root Cause" entry in torchrun's ChildFailedError report."""
    _, sep, tail = output.partition("Root Cause (first observed failure):")
    if not sep:
        return None
    rank = re.search(r"rank\s*:\s*(\d+)", tail)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", tail)
    return (int(rank.group(1)), int(code.group(1))) if rank and code else None


def assert_one_line_error(proc, must_name: list[str], torchrun: bool) -> str:
    output = proc.stdout + proc.stderr
    where = f"\n--- output tail ---\n{os.linesep.join(output.splitlines()[-60:])}"
    assert proc.returncode != 0, where
    lines = error_lines(output)
    assert len(lines) == 1, f"expected one {PREFIX!r} line, got {lines}{where}"
    for text in must_name:
        assert text in lines[0], f"{text!r} not named in: {lines[0]}"
    assert child_frames(output) == [], f"traceback from the training process: {child_frames(output)}{where}"
    if torchrun:
        assert launcher_only_frames(output), where
        # The worker left through adaptor.errors.fail (SystemExit(2)), not an
        # uncaught exception (1); and rank 0, the one that prints, was the
        # first to exit rather than being SIGTERMed by torchrun before it could.
        assert torchrun_root_cause(output) == (0, 2), where
    else:
        assert "Traceback" not in output, where
        assert proc.returncode == 2, where
    return lines[0]


def assert_nothing_written(scratch: Path) -> None:
    leftovers = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*"))
    assert leftovers == [], f"the failed run wrote {leftovers}"


@pytest.fixture
def scratch(tmp_path) -> Path:
    """Empty working directory; --save points inside it."""
    d = tmp_path / "run"
    d.mkdir()
    return d


def save_args(scratch: Path) -> list[str]:
    return ["--save", str(scratch / "ckpt"), "--save-interval", "1"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A real, small Megatron indexed dataset; returns its prefix."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    import torch

    d = tmp_path_factory.mktemp("data")
    prefix = d / "real"
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(64):
        builder.add_document(torch.from_numpy(rng.integers(1, 999, size=200, dtype=np.int32)), [200])
    builder.finalize(str(prefix) + ".idx")
    return prefix


def dataset_dir_untouched(prefix: Path) -> None:
    assert sorted(p.name for p in prefix.parent.iterdir()) == [prefix.name + ".bin", prefix.name + ".idx"]


# -- a) parallel layouts that do not divide the world size -----------------------------------

@pytest.mark.parametrize(
    "nproc, layout, named",
    [
        pytest.param(2, ["--num-layers", "4", "--pipeline-model-parallel-size", "4"],
                     ["world size 2", "--pipeline-model-parallel-size 4", "= 4"], id="pp4-on-2-procs"),
        pytest.param(3, ["--tensor-model-parallel-size", "2"],
                     ["world size 3", "--tensor-model-parallel-size 2", "= 2"], id="tp2-on-3-procs"),
    ],
)
def test_layout_not_dividing_world_size(scratch, nproc, layout, named):
    proc = run_torchrun(nproc, TINY + MOCK + layout + save_args(scratch), cwd=scratch)
    assert_one_line_error(proc, named, torchrun=True)
    assert_nothing_written(scratch)


def test_error_survives_a_late_rank0(scratch):
    """Rank 0 starts 2 s after rank 1 (a slow node, a cold file cache): rank 1 must not
    exit first and get rank 0 SIGTERMed by torchrun before it prints the reason."""
    late_rank0 = 'if [ "$RANK" = 0 ]; then sleep 2; fi; exec "$0" "$@"'
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           "--no-python", "sh", "-c", late_rank0, sys.executable, SCRIPT,
           *TINY, *MOCK, "--tensor-model-parallel-size", "3", *save_args(scratch)]
    proc = run(cmd, scratch, base_env())
    assert_one_line_error(proc, ["world size 2", "--tensor-model-parallel-size 3"], torchrun=True)
    assert_nothing_written(scratch)


# -- b) attention heads / query groups not divisible by TP ----------------------------------

@pytest.mark.parametrize(
    "shape, named",
    [
        pytest.param(THREE_HEADS, ["--num-attention-heads 3", "--tensor-model-parallel-size 2"], id="heads"),
        pytest.param(["--num-query-groups", "1"], ["--num-query-groups 1", "--tensor-model-parallel-size 2"],
                     id="query-groups"),
    ],
)
def test_heads_not_divisible_by_tp(scratch, shape, named):
    proc = run_torchrun(2, TINY + MOCK + shape + ["--tensor-model-parallel-size", "2"] + save_args(scratch),
                        cwd=scratch)
    assert_one_line_error(proc, named, torchrun=True)
    assert_nothing_written(scratch)


# -- c) --data-path files that do not exist ---------------------------------------------------

def test_missing_data_path(scratch):
    proc = run_python(TINY + ["--data-path", "/nonexistent/prefix"] + save_args(scratch), cwd=scratch)
    assert_one_line_error(proc, ["--data-path", "/nonexistent/prefix.bin", "/nonexistent/prefix.idx"],
                          torchrun=False)
    assert_nothing_written(scratch)


def test_missing_half_of_weighted_blend(scratch, dataset):
    blend = ["0.5", str(dataset), "0.5", "/nonexistent/b"]
    proc = run_python(TINY + ["--data-path", *blend] + save_args(scratch), cwd=scratch)
    line = assert_one_line_error(proc, ["--data-path", "'/nonexistent/b'"], torchrun=False)
    assert str(dataset) not in line, "the existing half of the blend was blamed"
    assert_nothing_written(scratch)
    dataset_dir_untouched(dataset)


def test_half_written_dataset(scratch, tmp_path, dataset):
    """A prefix with its .bin but no .idx names just the missing file."""
    partial = tmp_path / "partial"
    partial.with_suffix(".bin").write_bytes(Path(str(dataset) + ".bin").read_bytes())
    proc = run_python(TINY + ["--data-path", str(partial)] + save_args(scratch), cwd=scratch)
    line = assert_one_line_error(proc, ["--data-path", f"{partial}.idx"], torchrun=False)
    assert f"{partial}.bin" not in line
    assert_nothing_written(scratch)


def test_quoted_blend_is_one_prefix(scratch, dataset):
    """Megatron reads a quoted "0.5 a 0.5 a" as ONE prefix (get_blend_from_list does not
    split), so even with every file present it cannot train: say so in one line."""
    quoted = f"0.5 {dataset} 0.5 {dataset}"
    proc = run_python(TINY + ["--data-path", quoted] + save_args(scratch), cwd=scratch)
    assert_one_line_error(proc, ["--data-path", quoted, "separate, unquoted arguments"], torchrun=False)
    assert_nothing_written(scratch)
    dataset_dir_untouched(dataset)


def test_split_too_small_for_eval_stops_instead_of_hanging(scratch, dataset):
    """64 documents under --split 969,30,1 leave the test split empty; with --eval-iters 1
    the test split owes samples it cannot have. Upstream hung building the dataset."""
    args = TINY + ["--data-path", str(dataset), "--split", "969,30,1", "--eval-iters", "1",
                   "--eval-interval", "1", "--data-cache-path", str(scratch / "cache")]
    proc = run_python(args, cwd=scratch)
    assert_one_line_error(proc, [str(dataset), "test split has 0 documents", "--split (now 969,30,1)"],
                          torchrun=False)
    dataset_dir_untouched(dataset)


def test_hf_tokenizer_model_missing(scratch, dataset):
    args = TINY + ["--data-path", str(dataset), "--tokenizer-type", "HuggingFaceTokenizer",
                   "--tokenizer-model", "/nonexistent/tokenizer_dir"] + save_args(scratch)
    proc = run_python(args, cwd=scratch)
    assert_one_line_error(proc, ["--tokenizer-model /nonexistent/tokenizer_dir", "no such file"], torchrun=False)
    assert_nothing_written(scratch)


# -- d) unknown backend -----------------------------------------------------------------------

def test_unknown_backend(scratch):
    proc = run_python(TINY + MOCK + save_args(scratch), cwd=scratch, ADAPTOR_BACKEND="tpu")
    assert_one_line_error(proc, ["ADAPTOR_BACKEND='tpu'", "npu, cuda, cpu"], torchrun=False)
    assert "[megatron-adaptor] backend=" not in proc.stdout
    assert_nothing_written(scratch)


def test_unknown_backend_under_torchrun(scratch):
    """Import-time failure on every rank: still one line, printed by rank 0."""
    proc = run_torchrun(2, TINY + MOCK + save_args(scratch), cwd=scratch, ADAPTOR_BACKEND="tpu")
    assert_one_line_error(proc, ["ADAPTOR_BACKEND='tpu'"], torchrun=True)
    assert_nothing_written(scratch)


# -- the good command line these cases bend --------------------------------------------------

def test_control_same_shapes_train(scratch, dataset):
    """Real dataset in the weighted-blend form, the 3-head shape of case b on one rank:
    trains, so every failure above comes from the one value its case changes."""
    blend = ["0.5", str(dataset), "0.5", str(dataset)]
    # Megatron caches the blend's sample indices; keep them out of the shared dataset's folder.
    # The default --split 969,30,1 gives this 64-document dataset an empty test split, which
    # upstream's GPTDataset._get_num_epochs looped on forever even with no test samples asked
    # for; patches/upstream_fixes/empty_dataset_split.py lets an empty split that owes no samples through.
    cache = ["--data-cache-path", str(scratch / "cache")]
    proc = run_torchrun(1, TINY + THREE_HEADS + ["--data-path", *blend] + cache, cwd=scratch)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, "\n".join(output.splitlines()[-60:])
    assert re.search(r"iteration\s+2/\s*2 ", output), "\n".join(output.splitlines()[-60:])
    assert error_lines(output) == []
