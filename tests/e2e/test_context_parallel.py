"""Context parallelism and packed documents without Transformer Engine.

* Attention alone (``tests/scripts/cp_attention_parity.py`` on 2 and 4 gloo processes): ring,
  Ulysses and hybrid CP forward and backward against one process's attention of the whole
  sequence, for causal, GQA, packed (uneven documents), MLA head dims and non-causal inputs; on
  the CPU kernels and through the torch_npu stand-in (``npu_fusion_attention`` and its grad with
  softmax statistics, BNSD and TND). Tolerance 2e-5 absolute on unit-variance inputs: the pieces
  are merged through their log-sum-exp in fp32, so errors are fp32 rounding (measured ~1e-6).
* Training: packed documents (``--reset-attention-mask`` with the fused attention, THD) against
  the dense [s, s] mask, also split over CP ranks; ``--dataloader-inter-document-masking`` at
  CP = 2 against CP = 1; YaRN and linear RoPE scaling at CP = 2 against CP = 1. Every run starts
  from the same checkpoint (tests/e2e/test_parallel_loss_curves.py's ``common_start`` recipe) and
  trains 10 fp32 iterations; the same rtol 2e-5 as the other layouts (see there), far below the
  1e-2 of a wrong mask or position.
* Bad layouts: one line each, before any process group exists.

Context-parallel loss curves of the plain model: tests/e2e/test_parallel_loss_curves.py;
DeepSeek-V3 (MLA, MoE with EP) at CP = 2: tests/e2e/test_deepseek_v3.py.
"""
from __future__ import annotations

import re

import pytest

from helpers.megatron_runs import train_from as _train_from
from helpers.megatron_runs import TINY_QWEN3, run_pretrain, tail, worst_relative_gap
from helpers.megatron_runs import Run, launch
from helpers.npu_contract import standin_env
from helpers.one_line_errors import assert_one_line_error, run_torchrun
from helpers.paths import ROOT
from helpers.prefetch import prefetched
from helpers.processes import free_port

ITERS = 10
RTOL = 2e-5
PARITY = ROOT / "tests" / "scripts" / "cp_attention_parity.py"
CASES = ("causal", "gqa", "packed", "mla_head_dims", "non_causal")


# ------------------------------------------------------------------------------- attention
def _parity(algo: str, nproc: int, env: dict | None = None) -> Run:
    return launch(PARITY, ["--algo", algo], nproc, env, timeout=600)


@pytest.mark.parametrize("algo,nproc", [("p2p", 2), ("a2a", 2), ("a2a+p2p", 4), ("p2p", 4)])
def test_attention_matches_one_process(algo, nproc):
    proc = _parity(algo, nproc, env=standin_env(OMP_NUM_THREADS="1"))
    reported = re.findall(r"CASE (\w+) max_err (\S+)", proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [name for name, _ in reported] == list(CASES), proc.stdout


@pytest.mark.parametrize("algo,nproc", [("p2p", 2), ("a2a+p2p", 4)])
def test_attention_through_the_npu_kernels(algo, nproc, tmp_path):
    """Ring blocks on npu_fusion_attention(_grad) with merged statistics; TND for the packed case."""
    log = tmp_path / "calls"
    proc = _parity(algo, nproc, env=standin_env(ADAPTOR_BACKEND="npu", STANDIN_NPU_CALL_LOG=str(log),
                                                OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(re.findall(r"CASE \w+ max_err", proc.stdout)) == len(CASES), proc.stdout
    import glob
    import json

    counts = [json.load(open(p)) for p in glob.glob(f"{log}.*.json")]
    assert len(counts) == nproc
    assert all(c.get("npu_fusion_attention", 0) > 0 and c.get("npu_fusion_attention_grad", 0) > 0 for c in counts)


# -------------------------------------------------------------------------------- training
@prefetched
def common_start(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("cp_common_start")
    run = run_pretrain(TINY_QWEN3 + ["--train-iters", "1", "--lr", "0", "--min-lr", "0",
                                     "--save", str(ckpt), "--save-interval", "1"])
    assert run.returncode == 0, tail(run.output)
    return ckpt


def train_from(ckpt, nproc=1, extra=()):
    return _train_from(TINY_QWEN3, ckpt, ITERS, nproc, extra)


PACKED = ["--reset-attention-mask", "--reset-position-ids", "--eod-mask-loss"]
YARN = ["--position-embedding-type", "yarn", "--rotary-scaling-factor", "4",
        "--yarn-original-max-position-embeddings", "16"]
LINEAR = ["--rotary-seq-len-interpolation-factor", "4"]
CP2 = ["--context-parallel-size", "2"]

# name -> (reference: 1 process, run compared with it: nproc, extra)
PAIRS = {
    # the dense [s, s] mask (megatron-core's DotProductAttention) against boundaries split over 2 ranks
    "packed_cp2_ring": ([*PACKED], (2, [*PACKED, *CP2, "--cp-comm-type", "p2p"])),
    "packed_cp1_fused": ([*PACKED], (1, [*PACKED, "--use-flash-attn"])),
    "inter_document_cp2_ulysses": (["--dataloader-inter-document-masking"],
                                   (2, ["--dataloader-inter-document-masking", *CP2, "--cp-comm-type", "a2a"])),
    "yarn_packed_cp2_ring": ([*YARN, *PACKED], (2, [*YARN, *PACKED, *CP2])),
    "linear_rope_cp2_ulysses": ([*LINEAR], (2, [*LINEAR, *CP2, "--cp-comm-type", "a2a"])),
}


@prefetched
def references(common_start):
    from helpers.megatron_runs import side_by_side

    names = list(PAIRS)
    runs = side_by_side(*[(lambda n=n: train_from(common_start, extra=PAIRS[n][0])) for n in names])
    return dict(zip(names, runs))


@pytest.mark.parametrize("pair", PAIRS)
def test_training_reproduces_the_one_process_curve(pair, common_start, references):
    nproc, extra = PAIRS[pair][1]
    ours, ref = train_from(common_start, nproc=nproc, extra=extra).curve(), references[pair].curve()
    worst = worst_relative_gap(ours, ref)
    assert worst <= RTOL, f"max relative difference {worst:.2e} > {RTOL}\n{ours}\n{ref}"


def test_references_differ_where_they_should(references):
    """The checks can fail: the packed mask, inter-document masking and each RoPE scaling change the curve."""
    plain = references["packed_cp1_fused"].curve()
    for other in ("inter_document_cp2_ulysses", "yarn_packed_cp2_ring", "linear_rope_cp2_ulysses"):
        assert worst_relative_gap(references[other].curve(), plain) > 10 * RTOL, other


# ----------------------------------------------------------------- per-document losses
PACKED_LOSSES = ROOT / "tests" / "scripts" / "packed_document_losses.py"


@pytest.fixture(scope="module")
def document_losses():
    """Per-document losses of one packed stream against each document alone, for each RoPE variant."""
    import json

    out = {}
    for rope in ("rope", "yarn", "linear"):
        proc = launch(PACKED_LOSSES, [str(free_port()), rope], env=standin_env(OMP_NUM_THREADS="1",
                                                                               ADAPTOR_BACKEND="cpu"),
                      launcher="python", timeout=300)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
        out[rope] = json.loads(line[0][len("RESULT "):])
    return out


@pytest.mark.parametrize("rope", ["rope", "yarn", "linear"])
def test_packed_batch_gives_each_documents_own_losses(document_losses, rope):
    """fp32, the same model: per-token losses and parameter gradients equal up to fp32 summation order."""
    r = document_losses[rope]
    assert r["max_loss_diff"] <= 1e-5, r
    assert r["max_grad_diff"] <= 1e-5 * r["grad_scale"], r
    assert r["control_diff"] > 1e-2, r  # without boundaries, documents see each other: the check can fail


def test_rope_scalings_change_the_losses(document_losses):
    base = document_losses["rope"]["mean_loss"]
    assert abs(document_losses["yarn"]["mean_loss"] - base) > 1e-4
    assert abs(document_losses["linear"]["mean_loss"] - base) > 1e-4


# ------------------------------------------------------------------------------- bad input
BAD = {
    "heads_vs_ulysses": (["--context-parallel-size", "2", "--cp-comm-type", "a2a", "--num-attention-heads", "2",
                          "--num-query-groups", "2", "--tensor-model-parallel-size", "2"], 4,
                         "--num-attention-heads 2 is not divisible by --tensor-model-parallel-size 2 x the Ulysses "
                         "degree 2"),
    "seq_length": (["--context-parallel-size", "2", "--seq-length", "66", "--max-position-embeddings", "66"], 2,
                   "--seq-length 66 is not divisible by 2 x --context-parallel-size 2 = 4"),
    "world_size": (["--context-parallel-size", "2", "--tensor-model-parallel-size", "2"], 2,
                   "world size 2 is not divisible by --tensor-model-parallel-size 2 x --pipeline-model-parallel-size "
                   "1 x --context-parallel-size 2 = 4"),
    "comm_type": (["--context-parallel-size", "2", "--cp-comm-type", "allgather"], 2,
                  "--cp-comm-type allgather is not available without Transformer Engine; use one of p2p, a2a, a2a+p2p"),
    "hybrid_sizes": (["--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"], 2,
                     "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes U R"),
    "dropout": (["--context-parallel-size", "2", "--attention-dropout", "0.1"], 2,
                "--context-parallel-size 2 runs attention without dropout; add --attention-dropout 0.0"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_layout_is_one_line_before_process_groups(case, tmp_path):
    """One ``megatron-adaptor: error:`` line from rank 0 (exit 2), no traceback, nothing trained."""
    extra, nproc, line = BAD[case]
    proc = run_torchrun(nproc, TINY_QWEN3 + ["--train-iters", "1", *extra], tmp_path)
    assert_one_line_error(proc, [line], torchrun=True)
    assert "initializing torch distributed" not in proc.stdout + proc.stderr
