"""Profile chosen training iterations with torch_npu's profiler on NPU, torch's on CUDA and CPU.

One :class:`StepProfiler` per process: it starts before the step of iteration ``start`` and stops
after the step of iteration ``end - 1`` (Megatron's ``--profile-step-start``/``--profile-step-end``),
marking each step, and only on the chosen ranks. Traces go through each library's
``tensorboard_trace_handler``: on CPU/CUDA ``<save_path>/rank<R>.<time>.pt.trace.json`` (Chrome trace
JSON: chrome://tracing, Perfetto, TensorBoard's PyTorch profiler plugin); on NPU torch_npu's own
layout under ``save_path`` (MindStudio Insight, TensorBoard's plugin).
"""
from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("level0", "level1", "level2")


@dataclass(frozen=True)
class ProfilePlan:
    backend: str  # npu | cuda | cpu
    start: int
    end: int
    ranks: tuple[int, ...]  # empty: every rank
    save_path: str
    level: str = "level0"  # torch_npu's ProfilerLevel; torch's profiler has none
    with_cpu: bool = False  # host-side operators (always on for the CPU backend)
    with_memory: bool = False
    with_stack: bool = False
    record_shapes: bool = False

    def profiles_rank(self, rank: int) -> bool:
        return not self.ranks or rank in self.ranks

    @property
    def library(self) -> str:
        return "torch_npu.profiler" if self.backend == "npu" else "torch.profiler"

    def describe(self) -> str:
        what = [name for name, on in (("cpu", self.with_cpu or self.backend == "cpu"), ("memory", self.with_memory),
                                      ("stack", self.with_stack), ("shapes", self.record_shapes)) if on]
        level = f" {self.level}" if self.backend == "npu" else ""
        ranks = "every rank" if not self.ranks else "rank " + ",".join(map(str, self.ranks))
        return (f"{self.library}{level} ({', '.join(what) or 'device only'}) on {ranks}, iterations "
                f"{self.start}..{self.end - 1}, traces in {self.save_path}")


def make_profiler(plan: ProfilePlan, rank: int):
    """A profiler of ``plan``'s library, not yet started; its schedule records ``end - start`` steps then
    writes the trace (a schedule also makes each step a "ProfilerStep#N" range)."""
    steps = plan.end - plan.start
    if plan.backend == "npu":
        from torch_npu import profiler as npu_profiler

        activities = [npu_profiler.ProfilerActivity.NPU]
        if plan.with_cpu:
            activities.append(npu_profiler.ProfilerActivity.CPU)
        level = {"level0": npu_profiler.ProfilerLevel.Level0, "level1": npu_profiler.ProfilerLevel.Level1,
                 "level2": npu_profiler.ProfilerLevel.Level2}[plan.level]
        return npu_profiler.profile(
            activities=activities, record_shapes=plan.record_shapes, profile_memory=plan.with_memory,
            with_stack=plan.with_stack, schedule=npu_profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
            experimental_config=npu_profiler._ExperimentalConfig(profiler_level=level),
            on_trace_ready=npu_profiler.tensorboard_trace_handler(plan.save_path))
    import torch

    activities = []
    if plan.with_cpu or plan.backend == "cpu":
        activities.append(torch.profiler.ProfilerActivity.CPU)
    if plan.backend == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities, record_shapes=plan.record_shapes, profile_memory=plan.with_memory,
        with_stack=plan.with_stack, schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(plan.save_path, worker_name=f"rank{rank}"))


class StepProfiler:
    """Drives one profiler over iterations ``plan.start`` .. ``plan.end - 1`` of this rank."""

    def __init__(self, plan: ProfilePlan, rank: int) -> None:
        self.plan, self.rank = plan, rank
        self._profiler = None

    def before_step(self, iteration: int) -> None:
        if iteration == self.plan.start and self._profiler is None and self.plan.profiles_rank(self.rank):
            self._profiler = make_profiler(self.plan, self.rank)
            self._profiler.start()

    def after_step(self, iteration: int) -> None:
        if self._profiler is None:
            return
        self._profiler.step()  # closes this iteration's "ProfilerStep#N"; after the last, the trace is written
        if iteration + 1 >= self.plan.end:
            self.close()

    def close(self) -> None:
        """Stop and write the trace (also when training ends before ``end``)."""
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()
