"""DPO through Megatron's loop: posttrain_gpt.py --stage dpo on pairs from the repository's sample set.

The model is tests/helpers/hf_fixtures.py's tiny Qwen3 (fp32), loaded with ``--hf-load-dir``; the data
are the first four pairs of ``examples/data/sample_pairs.jsonl`` that fit 64 tokens, preprocessed by
``tools/preprocess_data.py --handler-name AlpacaStylePairwiseHandler``. With a global batch of four
pairs every step averages over the whole set, so the test knows each step's pairs without knowing
their order.

* First step, reference = the policy's start: the DPO loss is ln 2 (to 1e-6) and the reward margins
  are 0, for full fine-tuning and for LoRA (B = 0: the same model).
* Closed form: with ``--ref-model`` another tiny Qwen3 (a Hugging Face directory), label smoothing and
  ``--pref-ftx``, the first step's DPO loss, rewards and SFT term equal DPO's formulas computed from
  transformers' log-probabilities of the two models on the same token rows, within 1e-5 relative. The
  same run takes one plain SGD step at a large learning rate and writes ``--hf-save-dir``, so that
  ``(w0 - w1) / lr`` is Megatron's gradient: it equals transformers' autograd gradient of the same loss,
  tensor by tensor, within 1e-5 relative (norm of the difference; measured at most 1.6e-6).
* LoRA's closed form: the same one SGD step with LoRA on the four linears (the reference: the base without
  its adapters, at B = 0 the policy itself) is full DPO restricted to the adapters. With B0 = 0, dL/dA = 0
  and dL/dB = s G_W A0^T (s = alpha / r, G_W the full weight's gradient, PEFT's W + s B A), so the PEFT
  export holds A1 = A0 bit for bit (A0 redrawn from --seed as the run drew it) and B1 = -lr s G_W A0^T
  for every q/k/v/o/gate/up/down projection, within 1e-5 relative (measured at most 1.3e-6), with G_W
  transformers' autograd gradient of that loss (the reference's log-probabilities detached). peft loads
  the export onto the transformers policy, holding the file's tensors, and its logits move away from the
  base's.
* Layouts: TP2, PP2, CP2 and DP2 (distributed optimizer) reproduce the single-process DPO curve (TP2 and
  CP2 with the in-memory reference, the others with the values they precomputed): loss
  and rewards within 1e-5 x (|value| + 1). fp32 reductions in another order move the loss by ~1e-7 and the
  rewards (beta times differences of sequence log-probabilities of ~100) by ~1e-6 in three steps, while
  a wrong gradient, reward or pair order moves them by more than 1e-2 (the loss falls 0.69 -> 0.36 in
  those steps). PP2 runs the same layers on two ranks (the reference's activations cross the stages
  like the policy's), so the same tolerance holds (measured: within 8e-7 of the single-process values).
  CP2 splits every row's positions over two ranks and adds
  the rows' log-probabilities over them: the same sums in another order (measured: within 1.1e-6),
  where one rank's share of a row alone would leave out about half of each reward.
* Virtual pipeline stages (PP2, two model chunks per rank, Megatron's interleaved schedule): the curve
  is the single-process one within the same tolerance, and with ``--ref-model`` (the reference built and
  loaded chunk by chunk) the closed-form run's first step, loss, rewards and every gradient, equals
  transformers' closed form as the one-process run does.
* Precomputed reference (``--precompute-ref-logps``): the single-process, PP2 (values on the last stage
  only), DP2 (each rank half the pairs, added over the group) and LoRA (adapters off) runs compute the
  reference's log-probabilities of every pair before their first step; the files agree within 1e-5
  relative. Those runs hold no second model: the full run evaluates the starting policy itself, and
  only the closed-form run (``--ref-model``) loads one, for the pass, while its first step still equals
  the closed form; a run with the in-memory reference (TP2) announces its copy. A run that reads the
  file (``--ref-logps``, no reference model) reproduces the precomputing run's curve within the same
  tolerance (measured: equal to the printed 7 digits at every step). The same file serves IPO (its
  per-token means): an IPO run reading it reproduces the IPO run with the in-memory reference, whose
  first loss is IPO's closed form at equal policy and reference, 1 / (4 beta^2), with margins 0.
  The file's refusals (another dataset or ``--seq-length``, a truncated file, ``--ref-model``) are
  checked in-process (tests/unit/test_dpo.py).
* ``--variable-seq-lengths`` on one stage: rows built 96 wide and cut after each micro-batch's last
  position in the loss reproduce the 64-wide run's curve within the same tolerance (a cut 8 positions
  short moves the second loss by 1e-2).
* Packed pairs: the same four pairs preprocessed with ``--pack`` (two whole pairs per sample, each the
  same segment of the chosen and the rejected row) reproduce the single-process curve within the same
  tolerance, on one process and at PP2 (a dense mask per pair, built on each stage) and at CP2 (one THD
  stream with the pairs' boundaries, split over two ranks); with ``--calculate-per-token-loss`` Megatron divides the step's
  summed loss by its pairs, as the unpacked run's equal micro-batches average it (measured: within
  1.3e-6). Attention across the pairs of a sample moves the second loss by 1e-2. The packed run's
  ``--precompute-ref-logps`` file holds, pair by pair, the unpacked run's values.
* TensorBoard: the DP2 run's events hold the loss and the four reward values of every iteration, equal to
  its log line (rewards below zero included, which Megatron's line leaves out).
* Bad input is one line: an instruction dataset with --stage dpo (tests/e2e/test_finetune.py's
  ``other_stage`` case); the other refusals are checked in-process (tests/unit/test_dpo.py).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers.megatron_runs import run_pretrain, side_by_side, tail
from helpers.paths import EXAMPLES, ROOT, SAMPLE_TOKENIZER, TESTS, TOOLS
from helpers.prefetch import prefetched

SEQ, PAIRS, ITERS, RTOL = 64, 4, 3, 1e-5
PACKED_SEQ = 2 * SEQ + 4  # two pairs fit a sample (each side at most SEQ + 1 tokens); CP2 needs a multiple of 4
BETA, SMOOTHING, FTX = 0.1, 0.1, 0.5
STEP = 100.0  # the closed-form run's SGD learning rate: (w0 - w1) / STEP is Megatron's gradient
LORA_R, LORA_ALPHA, SEED = 8, 16, 1234
LORA = ["--lora-r", str(LORA_R), "--lora-alpha", str(LORA_ALPHA), "--lora-target-modules", "linear_qkv",
        "linear_proj", "linear_fc1", "linear_fc2"]
# one plain SGD step (its first step has no momentum yet), no clipping or decay: w1 = w0 - STEP * gradient
ONE_SGD_STEP = ["--dpo-label-smoothing", str(SMOOTHING), "--pref-ftx", str(FTX), "--optimizer", "sgd", "--lr", str(STEP),
                "--lr-decay-style", "constant", "--clip-grad", "0", "--weight-decay", "0", "--model-type-hf", "qwen3"]
FIELD = re.compile(r"\| ([a-z/ ]+): ([0-9.Ee+-]+)")
ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ ")

SETUP = f"""
import json, sys
sys.path[:0] = [{str(TESTS)!r}, {str(TOOLS)!r}]
from transformers import AutoTokenizer
from helpers.hf_fixtures import make_tiny_qwen3
import preprocess_data
root = sys.argv[1]
# Megatron pads the vocabulary to a multiple of 128 x TP and its softmax covers the padding rows: a
# checkpoint already that wide is the same distribution in both libraries
vocab = -(-len(AutoTokenizer.from_pretrained({str(SAMPLE_TOKENIZER)!r})) // 256) * 256
make_tiny_qwen3(root + "/policy", vocab_size=vocab, seed=3)
make_tiny_qwen3(root + "/reference", vocab_size=vocab, seed=4)
kept = []
for line in open({str(EXAMPLES / "data" / "sample_pairs.jsonl")!r}):
    record = json.loads(line)
    short = sum(len(record[k]) for k in ("instruction", "input", "chosen", "rejected")) < 56
    if short and "history" not in record and "system" not in record and len(kept) < {PAIRS}:
        kept.append(line)
open(root + "/pairs.jsonl", "w").write("".join(kept))
common = ["--input", root + "/pairs.jsonl", "--handler-name", "AlpacaStylePairwiseHandler", "--prompt-type", "qwen3",
    "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", {str(SAMPLE_TOKENIZER)!r}]
assert preprocess_data.main([*common, "--output-prefix", root + "/pairs", "--seq-length", "{SEQ + 1}"]) == 0
sys.exit(preprocess_data.main([*common, "--output-prefix", root + "/packed", "--seq-length", "{PACKED_SEQ + 1}",
    "--pack"]))
"""


@prefetched
def setup(tmp_path_factory):
    """Two tiny Qwen3 directories and the pairwise dataset, written by a child interpreter (transformers
    seeds torch's global generator, which this process's tests must keep)."""
    root = tmp_path_factory.mktemp("dpo")
    proc = subprocess.run([sys.executable, "-c", SETUP, str(root)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def dpo_args(root, *extra):
    return ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(SAMPLE_TOKENIZER),
            "--hf-load-dir", str(root / "policy"), "--seq-length", str(SEQ), "--micro-batch-size", "2",
            "--global-batch-size", str(PAIRS), "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
            "--clip-grad", "1.0", "--attention-dropout", "0", "--hidden-dropout", "0", "--seed", str(SEED),
            "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000", "--disable-jit-fuser",
            "--data-path", str(root / "pairs"), "--split", "100,0,0", "--stage", "dpo", "--is-pairwise-dataset",
            "--prompt-type", "qwen3", "--dpo-beta", str(BETA), *extra]


def logged(output: str) -> dict[int, dict[str, float]]:
    """Iteration -> {name: value} of Megatron's log lines."""
    found = {}
    for line in output.splitlines():
        match = ITERATION.search(line)
        if match and "rewards/" in line:  # Megatron's line, and the one with the rewards below zero
            found.setdefault(int(match.group(1)), {}).update({k.strip(): float(v) for k, v in FIELD.findall(line)})
    return found


class Steps(dict):
    """Iteration -> logged values, and the run's whole output."""

    output = ""


def train(root, nproc=1, iters=ITERS, extra=()):
    run = run_pretrain(dpo_args(root, "--train-iters", str(iters), *extra), nproc=nproc, script="posttrain_gpt.py")
    assert run.returncode == 0, tail(run.output)
    steps = Steps(logged(run.output))
    assert sorted(steps) == list(range(1, iters + 1)), tail(run.output)
    steps.output = run.output
    return steps


# Two packed samples hold the four pairs; Megatron divides the summed loss by the pairs of the step
# (--calculate-per-token-loss), as the unpacked run's equal micro-batches average it.
PACKED = ["--data-path", "packed", "--seq-length", str(PACKED_SEQ), "--global-batch-size", "2",
          "--calculate-per-token-loss"]
# two pipeline stages of two virtual stages each: one of the 4 layers per model chunk, interleaved schedule
VIRTUAL = ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]
LAYOUTS = {
    "full": (1, ITERS, ["--precompute-ref-logps", "ref.logps"]),
    "tp2": (2, ITERS, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ITERS, ["--pipeline-model-parallel-size", "2", "--precompute-ref-logps", "pp2.logps"]),
    "cp2": (2, ITERS, ["--context-parallel-size", "2"]),
    "dp2": (2, ITERS, ["--use-distributed-optimizer", "--precompute-ref-logps", "dp2.logps", "--tensorboard-dir",
                       "tb_dp2"]),
    "pp2_vp2": (2, ITERS, VIRTUAL),
    "lora": (1, ITERS, [*LORA, "--precompute-ref-logps", "lora.logps"]),
    "ipo": (1, ITERS, ["--dpo-loss-type", "ipo"]),
    "closed_form": (1, 1, ["--ref-model", "reference", *ONE_SGD_STEP, "--hf-save-dir", "after_one_step",
                           "--precompute-ref-logps", "closed_form.logps"]),
    "lora_closed_form": (1, 1, [*LORA, *ONE_SGD_STEP, "--hf-save-dir", "lora_after_one_step"]),
    # virtual stages: the reference loaded chunk by chunk, every chunk's gradient
    "vp_closed_form": (2, 1, [*VIRTUAL, "--ref-model", "reference", *ONE_SGD_STEP, "--hf-save-dir",
                              "vp_after_one_step"]),
    # rows built 96 wide and cut back: the cut drops padding the 64-wide run never had
    "variable_seq_lengths": (1, ITERS, ["--seq-length", str(SEQ + 32), "--variable-seq-lengths"]),
    # the same four pairs packed two to a sample: a dense mask per pair (one process, and on both of two
    # pipeline stages), then THD split over two CP ranks
    "packed": (1, ITERS, [*PACKED, "--micro-batch-size", "2", "--precompute-ref-logps", "packed.logps"]),
    "packed_cp2": (2, ITERS, [*PACKED, "--micro-batch-size", "1", "--context-parallel-size", "2"]),
    "packed_pp2": (2, ITERS, [*PACKED, "--micro-batch-size", "1", "--pipeline-model-parallel-size", "2"]),
}
PATHS = ("reference", "tb_dp2", "ref.logps", "pp2.logps", "dp2.logps", "lora.logps", "closed_form.logps", "after_one_step", "lora_after_one_step", "vp_after_one_step", "packed",
         "packed.logps")


@prefetched
def runs(setup):
    def job(name):
        nproc, iters, extra = LAYOUTS[name]
        extra = [str(setup / e) if e in PATHS else e for e in extra]
        return lambda: train(setup, nproc, iters, extra)

    return dict(zip(LAYOUTS, side_by_side(*[job(name) for name in LAYOUTS])))


@pytest.mark.parametrize("name", ["full", "lora"])
def test_first_step_against_the_starting_policy_is_ln2(runs, name):
    first = runs[name][1]
    assert abs(first["dpo loss"] - math.log(2)) <= 1e-6, first
    assert first["rewards/margins"] == 0 and first["rewards/chosen"] == 0, first
    later = runs[name][ITERS]
    assert later["dpo loss"] < first["dpo loss"] and later["rewards/margins"] > 0, runs[name]
    assert 0 <= later["rewards/accuracies"] <= 1, later


def test_first_ipo_step_against_the_starting_policy_is_its_target_squared(runs):
    """IPO regresses the mean log-ratio margin h to 1 / (2 beta): at h = 0 the loss is 1 / (4 beta^2)."""
    first, later = runs["ipo"][1], runs["ipo"][ITERS]
    assert abs(first["dpo loss"] - 1 / (4 * BETA ** 2)) <= 1e-6 * first["dpo loss"], first
    assert first["rewards/margins"] == 0, first
    assert later["dpo loss"] < first["dpo loss"] and later["rewards/margins"] > 0, runs["ipo"]


def test_rewards_reach_tensorboard(setup, runs):
    """The DP2 run's TensorBoard events hold, per iteration, the values of its log line (both data-parallel
    ranks' pairs averaged), rewards below zero included."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(setup / "tb_dp2"))
    events.Reload()
    keys = ("dpo loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
    assert set(keys) <= set(events.Tags()["scalars"]), events.Tags()["scalars"]
    for key in keys:
        written = {e.step: e.value for e in events.Scalars(key)}
        assert sorted(written) == list(range(1, ITERS + 1)), (key, written)
        for step, value in written.items():  # the log line prints 7 significant digits
            assert value == pytest.approx(runs["dp2"][step][key], rel=1e-6, abs=1e-12), (key, step)
    assert any(e.value < 0 for e in events.Scalars("rewards/rejected"))  # left off Megatron's line, not here


def test_lora_trains_differently_from_full_dpo(runs):
    assert runs["lora"][1]["dpo loss"] == runs["full"][1]["dpo loss"]
    assert runs["lora"][ITERS]["dpo loss"] != pytest.approx(runs["full"][ITERS]["dpo loss"], rel=1e-4)


@pytest.mark.parametrize("layout", ["tp2", "pp2", "cp2", "dp2", "pp2_vp2"])
def test_parallel_dpo_reproduces_the_single_process_curve(runs, layout):
    for step in range(1, ITERS + 1):
        for key in ("dpo loss", "rewards/chosen", "rewards/rejected"):
            got, want = runs[layout][step][key], runs["full"][step][key]
            # rewards are beta times differences of sequence log-probabilities of ~100 each: their error
            # is absolute (~1e-6 measured at step 3), hence the atol beside the relative tolerance
            assert abs(got - want) <= RTOL * (abs(want) + 1), (layout, step, key, got, want)


@pytest.mark.parametrize("layout", ["packed", "packed_cp2", "packed_pp2"])
def test_packed_pairs_reproduce_the_unpacked_curve(setup, runs, layout):
    """Pairs packed two to a sample train the curve of one pair per row: each pair's sequences attend only
    to themselves (a dense mask per pair; THD with CP) and their log-probabilities are summed per pair.
    Attention across the pairs of a sample moves the second loss by 1e-2 (measured)."""
    from adaptor.preference.pairwise_dataset import PairwiseLowLevel

    packed = PairwiseLowLevel(str(setup / "packed"))
    assert len(packed) == 2 and packed.pairs_per_sample.tolist() == [2, 2], packed.pairs_per_sample
    for step in range(1, ITERS + 1):
        for key in ("dpo loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies"):
            got, want = runs[layout][step][key], runs["full"][step][key]
            assert abs(got - want) <= RTOL * (abs(want) + 1), (layout, step, key, got, want)


def test_packed_pairs_record_each_pairs_reference_values(setup, runs):
    """--precompute-ref-logps on packed samples stores pair by pair, in the packed dataset's numbering, the
    values the unpacked run stored for the same pair (found by its tokens)."""
    from adaptor.preference import stored_reference
    from adaptor.preference.pairwise_dataset import PairwiseLowLevel

    def pairs_of(low):
        found = []
        for i in range(len(low)):
            sides = [low.side(i, side) for side in ("chosen", "rejected")]
            for k in range(int(low.pairs_per_sample[i])):
                found.append(tuple(tuple(ids[seg == k + 1]) for ids, _, seg in sides))
        return found

    alone = {pair: i for i, pair in enumerate(pairs_of(PairwiseLowLevel(str(setup / "pairs"))))}
    packed = pairs_of(PairwiseLowLevel(str(setup / "packed")))
    header, values = stored_reference.read(str(setup / "packed.logps"))
    _, want = stored_reference.read(str(setup / "ref.logps"))
    assert header["pairs"] == len(packed) == PAIRS and sorted(alone[p] for p in packed) == list(range(PAIRS))
    np.testing.assert_allclose(values, want[[alone[p] for p in packed]], rtol=RTOL)


def test_rows_cut_after_the_last_position_in_the_loss_train_the_same_curve(setup, runs):
    """--variable-seq-lengths on one stage, rows built SEQ + 32 wide: every micro-batch is cut (its last
    position in the loss lies well before that), and the curve is the SEQ-wide run's: the tokens cut reach
    no loss under a causal mask."""
    from adaptor.preference.pairwise_dataset import PairwiseLowLevel, build_pair

    low = PairwiseLowLevel(str(setup / "pairs"))
    last = max(int(build_pair(low, i, SEQ, 0)["loss_mask"].nonzero()[:, 1].max()) + 1 for i in range(PAIRS))
    assert -(-last // 8) * 8 < SEQ + 32, last
    for step in range(1, ITERS + 1):
        for key in ("dpo loss", "rewards/chosen", "rewards/rejected"):
            got, want = runs["variable_seq_lengths"][step][key], runs["full"][step][key]
            assert abs(got - want) <= RTOL * (abs(want) + 1), (step, key, got, want)


def _hf_sequence_logps(model, rows):
    """Per-row summed log-probabilities of the labelled tokens, and their counts, from a transformers model."""
    logits = model(input_ids=rows["tokens"], position_ids=rows["position_ids"]).logits.float()
    token = torch.log_softmax(logits, -1).gather(-1, rows["labels"].unsqueeze(-1)).squeeze(-1)
    return (token * rows["loss_mask"]).sum(-1), rows["loss_mask"].sum(-1)


@pytest.fixture(scope="module")
def pair_rows(setup):
    """The four pairs as the run's rows (chosen, rejected, chosen, ...)."""
    from adaptor.preference.pairwise_dataset import PairwiseLowLevel, build_pair

    low = PairwiseLowLevel(str(setup / "pairs"))
    assert len(low) == PAIRS
    pairs = [build_pair(low, i, SEQ, 0) for i in range(PAIRS)]
    return {k: torch.cat([p[k] for p in pairs]) for k in pairs[0]}


def _hf_model(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), torch_dtype=torch.float32).eval()


def _dpo_objective(policy, ref, counts):
    """Label-smoothed DPO and the SFT term per pair, and the logged values, from sequence log-probabilities
    of the rows (chosen, rejected, chosen, ...); the mean of ``dpo + FTX * sft`` is the run's loss."""
    pc, pr, rc, rr = policy[0::2], policy[1::2], ref[0::2], ref[1::2]
    h = (pc - pr) - (rc - rr)
    dpo = (-(1 - SMOOTHING) * torch.nn.functional.logsigmoid(BETA * h)
           - SMOOTHING * torch.nn.functional.logsigmoid(-BETA * h))
    sft = -pc / counts[0::2]
    values = {"dpo loss": dpo.mean(), "rewards/chosen": (BETA * (pc - rc)).mean(),
              "rewards/rejected": (BETA * (pr - rr)).mean(), "sft loss": sft.mean(),
              "rewards/margins": (BETA * h).mean()}
    return (dpo + FTX * sft).mean(), {k: float(v.detach()) for k, v in values.items()}


@pytest.fixture(scope="module")
def closed_form(setup, pair_rows):
    """DPO's closed form of the first step from transformers: the values the run logs, and the gradient of
    the mean loss (label-smoothed DPO plus the SFT term) with respect to the policy's weights."""
    model, reference = _hf_model(setup / "policy"), _hf_model(setup / "reference")
    policy, counts = _hf_sequence_logps(model, pair_rows)
    with torch.no_grad():
        ref, _ = _hf_sequence_logps(reference, pair_rows)
    loss, values = _dpo_objective(policy, ref, counts)
    loss.backward()
    weights = {name: p.detach().clone() for name, p in model.state_dict().items()}
    grads = {name: p.grad for name, p in model.named_parameters()}
    return values, weights, grads


@pytest.fixture(scope="module")
def lora_closed_form(setup, pair_rows):
    """The same loss where the reference is the policy itself (LoRA's base without adapters, at B = 0):
    the logged values and every weight's gradient, the reference's log-probabilities detached."""
    model = _hf_model(setup / "policy")
    policy, counts = _hf_sequence_logps(model, pair_rows)
    loss, values = _dpo_objective(policy, policy.detach(), counts)
    loss.backward()
    return values, {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("run", ["closed_form", "vp_closed_form"])
def test_first_step_equals_dpo_closed_form_from_transformers(closed_form, runs, run):
    expected = closed_form[0]
    first = runs[run][1]
    for key in ("dpo loss", "rewards/chosen", "rewards/rejected", "sft loss"):
        assert first[key] == pytest.approx(expected[key], rel=1e-5), (key, first, expected)
    assert first["rewards/margins"] == pytest.approx(expected["rewards/margins"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("saved", ["after_one_step", "vp_after_one_step"])
def test_first_step_gradients_equal_dpo_closed_form_from_transformers(setup, closed_form, runs, saved):
    """The run's one plain SGD step (no momentum yet, no clipping or decay) at learning rate STEP moved each
    weight by STEP times Megatron's gradient: (w0 - w1) / STEP, read from --hf-save-dir, equals transformers'
    autograd gradient of the same loss on the same pairs, tensor by tensor."""
    from safetensors.torch import load_file

    _, before, grads = closed_form
    after = {}
    for part in sorted((setup / saved).glob("*.safetensors")):
        after.update(load_file(str(part)))
    assert sorted(after) == sorted(grads), (sorted(after)[:4], sorted(grads)[:4])
    for name, want in grads.items():
        got = (before[name] - after[name]) / STEP
        # w1 = w0 - STEP g is rounded to fp32: the step dominates the weight, so the rounding is ~6e-8 of g
        # (measured: at most 1.6e-6, on the q/k norms, whose gradients are the smallest, ~7e-3)
        assert want.norm() > 0, name
        gap = float((got - want).norm() / want.norm())
        assert gap <= 1e-5, (name, gap, float(want.norm()))


# the Megatron linear whose adapter each Hugging Face projection's lora_A is (q/k/v and gate/up share theirs)
LINEAR_OF = {"self_attn.q_proj": "self_attention.linear_qkv", "self_attn.k_proj": "self_attention.linear_qkv",
             "self_attn.v_proj": "self_attention.linear_qkv", "self_attn.o_proj": "self_attention.linear_proj",
             "mlp.gate_proj": "mlp.linear_fc1", "mlp.up_proj": "mlp.linear_fc1", "mlp.down_proj": "mlp.linear_fc2"}
LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)$")


def _starting_lora_a(module: str, fan_in: int) -> torch.Tensor:
    """lora_A of ``module`` (``model.layers.N.self_attn.q_proj``) as the run drew it before its step
    (adaptor.lora.model.initialize_adapters): PEFT's kaiming-uniform from a CPU generator keyed by --seed
    and the Megatron linear's layer-numbered name."""
    layer, projection = LAYER.match(module).groups()
    key = f"{SEED}:decoder.layers.layer{int(layer) + 1}.{LINEAR_OF[projection]}"
    generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))
    a = torch.empty(LORA_R, fan_in)
    torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
    return a


def test_lora_first_step_is_full_dpo_restricted_to_the_adapters(setup, lora_closed_form, runs):
    """B0 = 0: A gets no gradient and B gets s G_W A0^T, G_W the full weight's gradient (module doc)."""
    from adaptor.convert.lora import PeftAdapter

    expected, grads = lora_closed_form
    first = runs["lora_closed_form"][1]
    assert abs(first["dpo loss"] - math.log(2)) <= 1e-6 and first["rewards/margins"] == 0, first
    assert first["sft loss"] == pytest.approx(expected["sft loss"], rel=1e-5), (first, expected)
    adapter = PeftAdapter(setup / "lora_after_one_step")
    modules = sorted({name.rsplit(".lora_", 1)[0].removeprefix("base_model.model.") for name in adapter.names})
    layers = json.loads((setup / "policy" / "config.json").read_text())["num_hidden_layers"]
    assert len(modules) == layers * len(LINEAR_OF) and len(adapter.names) == 2 * len(modules), modules
    scale = LORA_ALPHA / LORA_R
    for module in modules:
        a1 = adapter.get(f"base_model.model.{module}.lora_A.weight")
        b1 = adapter.get(f"base_model.model.{module}.lora_B.weight")
        assert torch.equal(a1, _starting_lora_a(module, a1.shape[1])), module  # no gradient reached A
        grad_w = grads[f"{module}.weight"].double()
        want = -STEP * scale * grad_w @ a1.double().t()
        assert want.norm() > 0, module
        gap = float((b1.double() - want).norm() / want.norm())
        assert gap <= 1e-5, (module, gap, float(want.norm()))


def test_lora_dpo_export_loads_in_peft(setup, pair_rows, runs):
    from peft import PeftModel

    from adaptor.convert.lora import PeftAdapter

    base = _hf_model(setup / "policy")
    with torch.no_grad():
        before = base(input_ids=pair_rows["tokens"], position_ids=pair_rows["position_ids"]).logits
    model = PeftModel.from_pretrained(base, str(setup / "lora_after_one_step")).eval()
    adapter = PeftAdapter(setup / "lora_after_one_step")
    loaded = {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}
    assert sorted(loaded) == sorted(adapter.names)
    assert all(torch.equal(loaded[n], adapter.get(n)) for n in loaded)
    with torch.no_grad():
        after = model(input_ids=pair_rows["tokens"], position_ids=pair_rows["position_ids"]).logits
    assert torch.isfinite(after).all() and float((after - before).abs().max()) > 1e-2


@pytest.mark.parametrize("name", ["pp2", "dp2", "lora"])
def test_every_layout_precomputes_the_same_reference_values(setup, runs, name):
    """--precompute-ref-logps before the first step: at PP2 the values exist on the last stage only, after
    crossing both stages; at DP2 each rank computes half of the pairs and the halves are added; with LoRA
    the pass runs with the adapters off. Each file holds what the single-process run's does."""
    from adaptor.preference import stored_reference

    header, values = stored_reference.read(str(setup / "ref.logps"))
    header_other, values_other = stored_reference.read(str(setup / f"{name}.logps"))
    assert header_other == header and values.shape == (PAIRS, 4) and not np.isnan(values).any()
    assert np.allclose(values_other, values, rtol=RTOL, atol=0), (values_other, values)


@pytest.mark.parametrize("name", ["full", "lora", "closed_form"])
def test_precomputing_runs_keep_no_reference_copy(runs, name):
    """The precomputing runs evaluate the reference before their first step and then train against the stored
    values: the starting policy itself (full), the adapters off (LoRA) or a --ref-model loaded for the pass
    only (closed form, whose first step still equals the closed form). Runs without it hold a copy."""
    out = runs[name].output
    assert "--precompute-ref-logps: the reference's log-probabilities of 4 pairs, computed before the first " \
           "step" in out, tail(out)
    assert ("DPO reference: a second model in memory" in out) == (name == "closed_form"), tail(out)
    assert "DPO reference: a second model in memory" in runs["tp2"].output, tail(runs["tp2"].output)


def test_stored_reference_reproduces_the_precomputing_runs_curve(setup, runs):
    """No reference model in these runs: their reference values come from the full (sigmoid) run's file,
    whose sums serve the sigmoid loss and whose per-token means serve IPO, which reproduces the IPO
    run with the in-memory reference."""
    stored = str(setup / "ref.logps")
    sigmoid, ipo = side_by_side(lambda: train(setup, extra=["--ref-logps", stored]),
                                lambda: train(setup, extra=["--ref-logps", stored, "--dpo-loss-type", "ipo"]))
    for run, want_run in ((sigmoid, runs["full"]), (ipo, runs["ipo"])):
        assert "DPO reference: a second model in memory" not in run.output, tail(run.output)
        for step in range(1, ITERS + 1):
            for key in ("dpo loss", "rewards/chosen", "rewards/rejected"):
                got, want = run[step][key], want_run[step][key]
                assert abs(got - want) <= RTOL * (abs(want) + 1), (step, key, got, want)
