"""Bad command lines end with ONE clear error line and a non-zero exit.

Each case runs pretrain_gpt.py the way a user would (torchrun where the world
size matters, otherwise plain ``python`` with the single-process rendezvous
variables torchrun would set, so that a regression reaches Megatron's real
failure instead of a missing MASTER_ADDR) and checks:

* a non-zero exit status;
* exactly one line starting with ``megatron-adaptor: error:`` in stdout+stderr
  together, and it names the flag/value at fault;
* no Python traceback from the training process (see ``helpers.one_line_errors.child_frames``);
* nothing written: ``--save`` points into an empty scratch directory that is
  also the working directory, and both stay empty; the directory holding the
  real half of a dataset blend keeps only its ``.bin``/``.idx``.

``test_control_same_shapes_train`` runs a good command line built from the same
pieces (real dataset, blend form, the head shapes of the TP case) so that the
failures above are known to come from the one bad value each case changes.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.datasets import write_indexed_dataset
from helpers.one_line_errors import (
    SCRIPT, assert_nothing_written, assert_one_line_error, base_env, error_lines, run, run_python,
    run_torchrun,
)
from helpers.megatron_runs import TwoAtATime
from helpers.processes import free_port

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
    d = tmp_path_factory.mktemp("data")
    prefix = d / "real"
    rng = np.random.default_rng(0)
    write_indexed_dataset(prefix, [rng.integers(1, 999, size=200, dtype=np.int32) for _ in range(64)], np.int32)
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
        # the data-parallel size 2 divides by 2, the expert data-parallel size 2 / EP 2 = 1 does not
        pytest.param(2, ["--num-experts", "2", "--expert-model-parallel-size", "2", "--use-distributed-optimizer",
                         "--num-distributed-optimizer-instances", "2"],
                     ["--num-distributed-optimizer-instances 2", "expert data-parallel size 1",
                      "--expert-model-parallel-size 2"], id="optimizer-instances-vs-expert-dp"),
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


# -- the one-process cases (c, d and the control run below) -------------------------------------
# Each uses one core: they start together, two at a time, when the first of them is asked for, and
# each test waits for its own. Every case gets its own empty scratch directory (and working directory).

@pytest.fixture(scope="module")
def one_process_cases(tmp_path_factory, dataset):
    """name -> Future of (proc, scratch, case directory)."""
    def case(name, args_of, torchrun=False, warm=True, **env):
        base = tmp_path_factory.mktemp(name)
        scratch = base / "run"
        scratch.mkdir()
        args = args_of(scratch, base)
        launch = (lambda: run_torchrun(1, args, cwd=scratch, warm=warm, **env)) if torchrun else \
            (lambda: run_python(args, cwd=scratch, warm=warm, **env))
        return lambda: (launch(), scratch, base)

    def half_written(scratch, base):
        partial = base / "partial"
        partial.with_suffix(".bin").write_bytes(Path(str(dataset) + ".bin").read_bytes())
        return TINY + ["--data-path", str(partial)] + save_args(scratch)

    blend = ["0.5", str(dataset), "0.5", str(dataset)]
    jobs = {
        # As a user launches it (the others start warm: docs/testing.md).
        "missing_data_path": case("missing_data_path", lambda scratch, _: TINY + ["--data-path", "/nonexistent/prefix"]
                                  + save_args(scratch), warm=False),
        "missing_half": case("missing_half", lambda scratch, _: TINY + ["--data-path", "0.5", str(dataset), "0.5",
                                                                      "/nonexistent/b"] + save_args(scratch)),
        "half_written": case("half_written", half_written),
        "quoted": case("quoted", lambda scratch, _: TINY + ["--data-path", f"0.5 {dataset} 0.5 {dataset}"]
                       + save_args(scratch)),
        "split_too_small": case("split_too_small", lambda scratch, _: TINY + [
            "--data-path", str(dataset), "--split", "969,30,1", "--eval-iters", "1", "--eval-interval", "1",
            "--data-cache-path", str(scratch / "cache")]),
        "hf_tokenizer_missing": case("hf_tokenizer_missing", lambda scratch, _: TINY + [
            "--data-path", str(dataset), "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", "/nonexistent/tokenizer_dir"] + save_args(scratch)),
        "attention_backend_window": case("attention_backend_window", lambda scratch, _: TINY + MOCK + [
            "--transformer-impl", "transformer_engine", "--attention-backend", "flash", "--window-size", "(8,0)"]
            + save_args(scratch)),
        "unknown_backend": case("unknown_backend", lambda scratch, _: TINY + MOCK + save_args(scratch),
                                ADAPTOR_BACKEND="tpu"),
        # Megatron caches the blend's sample indices; keep them out of the shared dataset's folder.
        # The default --split 969,30,1 gives this 64-document dataset an empty test split, which
        # upstream's GPTDataset._get_num_epochs looped on forever even with no test samples asked
        # for; patches/upstream_fixes/empty_dataset_split.py lets an empty split that owes no samples through.
        "control": case("control", lambda scratch, _: TINY + THREE_HEADS + ["--data-path", *blend]
                        + ["--data-cache-path", str(scratch / "cache")], torchrun=True),
    }
    pool = TwoAtATime()
    yield pool.start(jobs)
    pool.close()


# -- c) --data-path files that do not exist ---------------------------------------------------

def test_missing_data_path(one_process_cases):
    # run_python(TINY + ["--data-path", "/nonexistent/prefix"] + save_args(scratch), cwd=scratch)
    proc, scratch, _ = one_process_cases["missing_data_path"].result()
    assert_one_line_error(proc, ["--data-path", "/nonexistent/prefix.bin", "/nonexistent/prefix.idx"],
                          torchrun=False)
    assert_nothing_written(scratch)


def test_missing_half_of_weighted_blend(one_process_cases, dataset):
    # blend = ["0.5", str(dataset), "0.5", "/nonexistent/b"]: TINY + ["--data-path", *blend] + save_args(scratch)
    proc, scratch, _ = one_process_cases["missing_half"].result()
    line = assert_one_line_error(proc, ["--data-path", "'/nonexistent/b'"], torchrun=False)
    assert str(dataset) not in line, "the existing half of the blend was blamed"
    assert_nothing_written(scratch)
    dataset_dir_untouched(dataset)


def test_half_written_dataset(one_process_cases):
    """A prefix with its .bin but no .idx names just the missing file."""
    proc, scratch, tmp_path = one_process_cases["half_written"].result()
    partial = tmp_path / "partial"  # only partial.bin, a copy of the dataset's
    line = assert_one_line_error(proc, ["--data-path", f"{partial}.idx"], torchrun=False)
    assert f"{partial}.bin" not in line
    assert_nothing_written(scratch)


def test_quoted_blend_is_one_prefix(one_process_cases, dataset):
    """Megatron reads a quoted "0.5 a 0.5 a" as ONE prefix (get_blend_from_list does not
    split), so even with every file present it cannot train: say so in one line."""
    quoted = f"0.5 {dataset} 0.5 {dataset}"
    proc, scratch, _ = one_process_cases["quoted"].result()  # TINY + ["--data-path", quoted] + save_args(scratch)
    assert_one_line_error(proc, ["--data-path", quoted, "separate, unquoted arguments"], torchrun=False)
    assert_nothing_written(scratch)
    dataset_dir_untouched(dataset)


def test_split_too_small_for_eval_stops_instead_of_hanging(one_process_cases, dataset):
    """64 documents under --split 969,30,1 leave the test split empty; with --eval-iters 1
    the test split owes samples it cannot have. Upstream hung building the dataset."""
    proc, _, _ = one_process_cases["split_too_small"].result()
    assert_one_line_error(proc, [str(dataset), "test split has 0 documents", "--split (now 969,30,1)"],
                          torchrun=False)
    dataset_dir_untouched(dataset)


def test_hf_tokenizer_model_missing(one_process_cases):
    proc, scratch, _ = one_process_cases["hf_tokenizer_missing"].result()
    assert_one_line_error(proc, ["--tokenizer-model /nonexistent/tokenizer_dir", "no such file"], torchrun=False)
    assert_nothing_written(scratch)


# -- d) unknown backend -----------------------------------------------------------------------

def test_attention_backend_the_mapped_kernel_cannot_serve(one_process_cases):
    """Off Transformer Engine, --attention-backend flash is our FlashAttention, which has no sliding window."""
    proc, scratch, _ = one_process_cases["attention_backend_window"].result()
    assert_one_line_error(proc, ["--attention-backend flash maps to FlashAttention", "--window-size"], torchrun=False)
    assert_nothing_written(scratch)


def test_unknown_backend(one_process_cases):
    # run_python(TINY + MOCK + save_args(scratch), cwd=scratch, ADAPTOR_BACKEND="tpu")
    proc, scratch, _ = one_process_cases["unknown_backend"].result()
    assert_one_line_error(proc, ["ADAPTOR_BACKEND='tpu'", "npu, cuda, cpu"], torchrun=False)
    assert "[megatron-adaptor] backend=" not in proc.stdout
    assert_nothing_written(scratch)


def test_unknown_backend_under_torchrun(scratch):
    """Import-time failure on every rank: still one line, printed by rank 0."""
    proc = run_torchrun(2, TINY + MOCK + save_args(scratch), cwd=scratch, warm=False, ADAPTOR_BACKEND="tpu")
    assert_one_line_error(proc, ["ADAPTOR_BACKEND='tpu'"], torchrun=True)
    assert_nothing_written(scratch)


# -- the good command line these cases bend --------------------------------------------------

def test_control_same_shapes_train(one_process_cases):
    """Real dataset in the weighted-blend form, the 3-head shape of case b on one rank:
    trains, so every failure above comes from the one value its case changes."""
    # run_torchrun(1, TINY + THREE_HEADS + ["--data-path", "0.5", dataset, "0.5", dataset,
    #                                        "--data-cache-path", scratch / "cache"], cwd=scratch)
    proc, _, _ = one_process_cases["control"].result()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, "\n".join(output.splitlines()[-60:])
    assert re.search(r"iteration\s+2/\s*2 ", output), "\n".join(output.splitlines()[-60:])
    assert error_lines(output) == []
