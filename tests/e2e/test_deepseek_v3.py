"""DeepSeek-V3-style models (MLA + MoE + MTP) train through pretrain_gpt.py without Transformer Engine.

The model is ``TINY_DEEPSEEK_V3`` (tests/helpers/megatron_runs.py). As in test_parallel_loss_curves.py,
every run starts from one checkpoint written by a single process and trains 10 iterations in
fp32 on the same mock data; the TP2 (with sequence parallelism, which Megatron requires for MoE
with TP), PP2 and EP2 layouts, context parallelism with EP (CP2 x EP2: ring attention over MLA's
head dims, experts across the CP ranks), the allgather dispatcher and the grouped experts must
reproduce the single-process curves of both the lm loss and the MTP loss.

Tolerance: the layouts add the same numbers in other orders, so curves agree to fp32 rounding,
amplified where a reordered sum moves a token's top-2 experts. Measured maximum relative gaps over 10
iterations (lm / MTP loss): TP2+SP, the most reordering (attention, shared and routed experts split
over TP, sequence-parallel reduce-scatters), depends on the initial weights: 3.0e-5 / 2.6e-5 at
--seed 1234 and 7.5e-6 to 6.1e-5 / 2.9e-6 to 1.5e-5 at seeds 1 to 6 (the same compiled or not);
PP2 0, EP2 and CP2xEP2 1.8e-7 / 1.6e-7, allgather and grouped experts 0. RTOL = 2e-4 is 3.3x
above the largest and 38x below the 7.7e-3 gap of a run whose learning rate differs by 10%
(``test_tolerance_detects_a_wrong_run``).

Also here: megatron's uneven sequence-parallel gather on two gloo processes, and the YaRN flags in the
MLA config. The layer spec and MLA's core attention on their own: tests/unit/test_deepseek_v3.py.
"""
from __future__ import annotations

import math

import pytest

from helpers.megatron_runs import TINY_DEEPSEEK_V3, run_pretrain, side_by_side, tail, worst_relative_gap
from helpers.megatron_runs import launch as launch_script
from helpers.paths import ROOT
from helpers.prefetch import prefetched
from helpers.processes import tagged_json
ITERS = 10
RTOL = 2e-4


@prefetched
def common_start(tmp_path_factory):
    """Initial weights: one iteration at lr=0 changes nothing and lets Megatron save them."""
    ckpt = tmp_path_factory.mktemp("deepseek_v3_start")
    args = TINY_DEEPSEEK_V3 + ["--train-iters", "1", "--lr", "0", "--min-lr", "0",
                               "--save", str(ckpt), "--save-interval", "1"]
    run = run_pretrain(args)
    assert run.returncode == 0, tail(run.output)
    return ckpt


def launch(ckpt, nproc=1, extra=()):
    args = TINY_DEEPSEEK_V3 + ["--train-iters", str(ITERS), "--load", str(ckpt),
                               "--finetune", "--no-load-optim", "--no-load-rng", *extra]
    return run_pretrain(args, nproc=nproc)


def checked(run):
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, ITERS + 1)), tail(run.output)
    assert sorted(run.mtp_losses) == list(range(1, ITERS + 1)), tail(run.output)
    return run


LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "ep2": (2, ["--expert-model-parallel-size", "2"]),
    "allgather_dispatcher": (1, ["--moe-token-dispatcher-type", "allgather"]),
    # the experts' activation recomputed too: the flag Megatron allows only with grouped GEMM is checked
    # as given, not as the grouped-GEMM feature shows it to Megatron's own validation
    "grouped_experts": (1, ["--moe-grouped-gemm", "--recompute-granularity", "selective",
                            "--recompute-modules", "moe_act"]),
    "cp2_ep2": (2, ["--context-parallel-size", "2", "--expert-model-parallel-size", "2"]),
}
WRONG_LR = ["--lr", "1.1e-3"]


@prefetched
def one_process_runs(common_start):
    """The reference and every one-process variant, launched two at a time (one thread each)."""
    variants = {"reference": [], "wrong_lr": WRONG_LR}
    variants.update({name: extra for name, (nproc, extra) in LAYOUTS.items() if nproc == 1})
    runs = side_by_side(*[lambda extra=extra: launch(common_start, extra=extra) for extra in variants.values()])
    return dict(zip(variants, runs))


@pytest.fixture(scope="module")
def reference(one_process_runs):
    return checked(one_process_runs["reference"])


def curves(run):
    return run.curve(), [run.mtp_losses[i] for i in sorted(run.mtp_losses)]


def test_trains_single_process_with_mtp_loss_beside_lm_loss(reference):
    lm, mtp = curves(reference)
    assert all(math.isfinite(x) for x in lm + mtp)
    assert lm[-1] < lm[0] - 0.2, f"lm loss did not fall: {lm}"
    assert mtp[-1] < mtp[0] - 0.05, f"MTP loss did not fall: {mtp}"
    lines = [line for line in reference.output.splitlines() if f"iteration       {ITERS}/" in line]
    assert lines and "lm loss:" in lines[0] and "mtp_1 loss:" in lines[0], tail(reference.output)
    assert lines[0].index("lm loss:") < lines[0].index("mtp_1 loss:")
    assert "seq_load_balancing_loss:" in lines[0]  # --moe-router-load-balancing-type seq_aux_loss


def assert_same_curves(run, reference):
    for name, ours, ref in zip(("lm", "mtp"), curves(run), curves(reference)):
        worst = worst_relative_gap(ours, ref)
        assert worst <= RTOL, f"{name} loss: max relative difference {worst:.2e} > {RTOL}\n{ours}\n{ref}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_reproduces_single_process_curve(layout, common_start, one_process_runs, reference):
    nproc, extra = LAYOUTS[layout]
    run = one_process_runs[layout] if nproc == 1 else launch(common_start, nproc=nproc, extra=extra)
    assert_same_curves(checked(run), reference)


def test_tolerance_detects_a_wrong_run(one_process_runs, reference):
    """A run that differs in one hyperparameter (lr 1e-3 -> 1.1e-3) must fail the comparison."""
    wrong = checked(one_process_runs["wrong_lr"])
    with pytest.raises(AssertionError):
        assert_same_curves(wrong, reference)


# Two gloo processes: megatron's uneven sequence-parallel gather (rank r holds r + 2 rows), whose
# backward is the uneven reduce-scatter, as the alltoall dispatcher uses them with EP x TP; and
# the YaRN flags reaching the MLA config. Exact: gathers copy, and the sums add two integers.
COLLECTIVES_CHILD = r"""
import json, sys
sys.path.insert(0, "tests")
from helpers.megatron_runs import TINY_DEEPSEEK_V3
sys.argv = ["pretrain_gpt.py"] + TINY_DEEPSEEK_V3
import torch
import adaptor
import torch.distributed as dist
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

dist.init_process_group("gloo")
rank, group = dist.get_rank(), dist.new_group([0, 1])
sizes = [2, 3]
x = torch.full((sizes[rank], 3), float(rank + 1), requires_grad=True)
y = gather_from_sequence_parallel_region(x, group=group, output_split_sizes=sizes)
grad = torch.arange(15.0).view(5, 3) * (rank + 1)
y.backward(grad)
start = sum(sizes[:rank])
facts = {"gathered": y.tolist() == [[1.0] * 3] * 2 + [[2.0] * 3] * 3,
         "grad": x.grad.tolist() == (3 * torch.arange(15.0).view(5, 3)[start:start + sizes[rank]]).tolist()}
if rank == 0:
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.argument_utils import core_transformer_config_from_args
    args = parse_args()
    validate_args(args)
    config = core_transformer_config_from_args(args)
    facts["yarn"] = [config.rope_type, config.rotary_scaling_factor, config.original_max_position_embeddings]
    print("FACTS" + json.dumps(facts))
dist.barrier()
"""


def test_uneven_gather_on_gloo_and_mla_yarn_flags(tmp_path):
    script = tmp_path / "collectives_child.py"
    script.write_text(COLLECTIVES_CHILD)
    out = launch_script(script, nproc=2, env={"ADAPTOR_QUIET": "1", "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.output[-4000:]
    facts = tagged_json(out.stdout)
    assert facts["gathered"] and facts["grad"], facts
    # --yarn-original-max-position-embeddings 16 (upstream leaves MLA's default 4096)
    assert facts["yarn"] == ["yarn", 4.0, 16], facts
