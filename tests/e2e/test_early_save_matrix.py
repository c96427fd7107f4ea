"""A checkpoint saved before the optimizer has stepped resumes to the curve of a run that never stopped.

fp16's loss-scale warm-up skips the first iterations (here ``--initial-loss-scale 2097152``: the
tiny Qwen3's first gradients overflow it once, twice at DP=2), so the save of ``--save-interval 1``
at iteration 1 comes before Adam has any state. For each format and optimizer layout below, one run
of 4 iterations saves every iteration; a second ``--load``s its iteration-1 checkpoint and trains on
to 4. The first run's iteration 1 must be a skipped one (the save came before any step); the resumed
losses must equal the first run's to the last printed digit, and its iteration-4 checkpoint (weights,
Adam moments and step, grad scaler, RNG states) must equal the first run's byte for byte.

The cases pair each layout with the formats whose code paths differ for it: the plain Float16
optimizer (``common_step``), the distributed optimizer at DP=2 in Megatron's ``dp_reshardable`` and
``fully_reshardable`` layouts and our ``fully_sharded_model_space`` (the ``exp_avg`` gather of
``get_parameter_state_dp_zero``, the legacy ``torch`` format's too), the host-offloading Adam, and
torch FSDP2 in its ``torch_dcp`` format and ours. The state's equivalence to torch's lazy
initialisation: tests/unit/test_optimizer_state_from_start.py.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from helpers.checkpoint_compare import _compare_values, checkpoint_differences, torch_dcp_differences
from helpers.megatron_runs import TINY_QWEN3, TwoAtATime, run_pretrain, tail

ITERS = 4
FP16 = ["--fp16", "--initial-loss-scale", "2097152"]
DISTOPT = ["--use-distributed-optimizer"]
LAYOUTS = {  # layout: (processes, flags)
    "float16": (1, FP16),
    "offload": (1, FP16 + ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"]),
    "distopt_dp2": (2, FP16 + DISTOPT),
    "distopt_dp2_fully_reshardable": (2, FP16 + DISTOPT + ["--dist-ckpt-optim-fully-reshardable"]),
    "fsdp2_dp2": (2, FP16 + ["--use-torch-fsdp2"]),
}
CASES = [
    ("float16", "torch_dist"), ("float16", "torch"),
    ("offload", "torch_dist"),
    ("distopt_dp2", "torch_dist"), ("distopt_dp2", "safetensors"), ("distopt_dp2", "torch"),
    ("distopt_dp2_fully_reshardable", "torch_dist"),
    ("fsdp2_dp2", "torch_dcp"), ("fsdp2_dp2", "safetensors"),
]


def torch_format_differences(a: Path, b: Path) -> tuple[list[str], int]:
    """(differences, tensors compared) between two legacy ``--ckpt-format torch`` checkpoints: every
    rank's files (model, optimizer, RNG; the distributed optimizer's ``distrib_optim.pt``), arguments left out."""
    files = sorted(p.relative_to(a) for p in a.rglob("*.pt"))
    if not files or files != sorted(p.relative_to(b) for p in b.rglob("*.pt")):
        return [f"files differ: {files}"], 0
    out: list[str] = []
    count = 0
    for rel in files:
        sa, sb = (torch.load(d / rel, map_location="cpu", weights_only=False) for d in (a, b))
        for s in (sa, sb):
            s.pop("args", None)
        _compare_values(sa, sb, str(rel), out)
        count += sum(1 for _ in _tensors(sa))
    return out[:20], count


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _differences(fmt: str):
    return {"torch_dcp": torch_dcp_differences, "torch": torch_format_differences}.get(fmt, checkpoint_differences)


def save_and_resume(layout: str, fmt: str, workdir: Path):
    nproc, flags = LAYOUTS[layout]
    args = TINY_QWEN3 + flags + ["--ckpt-format", fmt, "--train-iters", str(ITERS), "--save-interval", "1"]
    first = run_pretrain(args + ["--save", str(workdir / "first")], nproc=nproc)
    if first.returncode != 0:
        return first, None
    load = workdir / "at1"  # the first run's iteration-1 checkpoint, as the latest of a --load directory
    load.mkdir()
    (load / "iter_0000001").symlink_to(workdir / "first" / "iter_0000001")
    (load / "latest_checkpointed_iteration.txt").write_text("1")
    return first, run_pretrain(args + ["--save", str(workdir / "resumed"), "--load", str(load)], nproc=nproc)


def _selected(session) -> list[tuple[str, str]]:
    """The cases of this module's tests that the session will run (``-k`` and node ids respected)."""
    chosen = {(item.callspec.params["layout"], item.callspec.params["fmt"]) for item in session.items
              if item.module.__name__ == __name__ and hasattr(item, "callspec")}
    return [case for case in CASES if case in chosen]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The selected cases' two runs, started at once: the one-process cases two at a time beside the two-process ones."""
    single, pool = TwoAtATime(), ThreadPoolExecutor(1)
    futures = {}
    for layout, fmt in _selected(request.session):
        workdir = tmp_path_factory.mktemp(f"early-{layout}-{fmt}")
        job = {(layout, fmt): (lambda l=layout, f=fmt, w=workdir: (save_and_resume(l, f, w), w))}
        futures.update(single.start(job) if LAYOUTS[layout][0] == 1 else {k: pool.submit(v) for k, v in job.items()})
    yield futures
    single.close()
    pool.shutdown(wait=True, cancel_futures=True)


def _first_line(output: str, iteration: int) -> str:
    return next(line for line in output.splitlines() if f"iteration {iteration:8d}/" in line)


@pytest.mark.parametrize("layout, fmt", CASES, ids=[f"{layout}-{fmt}" for layout, fmt in CASES])
def test_saved_before_the_first_step_resumes_bit_exactly(layout, fmt, runs):
    (first, resumed), workdir = runs[(layout, fmt)].result()
    assert first.returncode == 0, tail(first.output)
    assert "number of skipped iterations:   1" in _first_line(first.output, 1), tail(first.output)
    assert (workdir / "first" / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS)
    assert resumed.returncode == 0, tail(resumed.output)
    assert "at iteration 1" in resumed.output, tail(resumed.output)
    stepped = sorted(first.losses)  # the iterations that stepped (skipped ones log no loss)
    assert stepped and stepped[-1] == ITERS and stepped[0] > 1, tail(first.output)
    assert resumed.losses == first.losses, (resumed.losses, first.losses)
    diffs, count = _differences(fmt)(workdir / "first" / f"iter_{ITERS:07d}", workdir / "resumed" / f"iter_{ITERS:07d}")
    assert not diffs and count > 0, diffs
