"""``--profile`` with torch_npu's profiler on NPU and torch's on CPU, and MindSpeed's profile flags.

Upstream: ``megatron.training.training.train`` profiles iterations ``--profile-step-start`` ..
``--profile-step-end`` on ``--profile-ranks`` either with ``torch.profiler`` (``--use-pytorch-profiler``,
traces under ``<--tensorboard-dir>/../torch_profile``) or, without it, with CUDA's profiler API for
Nsight Systems, which only CUDA has. On NPU and CPU, and on any backend when one of MindSpeed's
flags (``--profile-level``, ``--profile-with-cpu``, ``--profile-with-memory``, ``--profile-with-stack``,
``--profile-record-shapes``, ``--profile-save-path``) is given, this feature profiles instead
(``adaptor.profiling``): it turns Megatron's own ``args.profile`` off after validation and wraps

* ``megatron.training.training.train_step``: starts the profiler before the first profiled step,
  marks each step, stops after the last (the trace is written then);
* ``megatron.training.training.train``: stops a profiler still running when training ends.

Plain ``--profile`` on CUDA keeps Megatron's own paths (Nsight Systems, or ``--use-pytorch-profiler``).
"""
from __future__ import annotations

import os

from adaptor.features import ArgumentError, Feature
from adaptor.log import notice

OWNER = __name__
DEFAULT_SAVE_PATH = "./profile_dir"
_OWN = ("profile_level", "profile_with_cpu", "profile_with_memory", "profile_with_stack", "profile_record_shapes",
        "profile_save_path")
_state: dict = {"plan": None, "profiler": None}


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _train_step(wrapped, instance, call_args, kwargs):
    profiler = _state["profiler"]
    iteration = kwargs.get("iteration")
    if profiler is None or iteration is None:
        return wrapped(*call_args, **kwargs)
    profiler.before_step(iteration)
    result = wrapped(*call_args, **kwargs)
    profiler.after_step(iteration)
    return result


def _train(wrapped, instance, call_args, kwargs):
    from adaptor.profiling import StepProfiler

    _state["profiler"] = StepProfiler(_state["plan"], _rank())
    try:
        return wrapped(*call_args, **kwargs)
    finally:
        _state["profiler"].close()


def _own_flags_given(flags) -> list[str]:
    return ["--" + dest.replace("_", "-") for dest in _OWN if getattr(flags, dest, None) not in (None, False)]


def save_path(args) -> str:
    """--profile-save-path, else Megatron's place beside --tensorboard-dir, else ./profile_dir."""
    if args.profile_save_path:
        return args.profile_save_path
    if args.tensorboard_dir:
        return os.path.normpath(os.path.join(args.tensorboard_dir, "..", "torch_profile"))
    return DEFAULT_SAVE_PATH


class Profiling(Feature):
    name = "profiling"
    upstream_flags = ("--profile",)

    def add_arguments(self, group) -> None:
        group.add_argument("--profile-level", choices=("level0", "level1", "level2"), default=None,
                           dest="profile_level", help="torch_npu profiler level (MindSpeed; default level0; "
                                                      "torch's profiler has no levels).")
        group.add_argument("--profile-with-cpu", action="store_true", dest="profile_with_cpu",
                           help="Profile host-side operators too (MindSpeed; always on for the CPU backend).")
        group.add_argument("--profile-with-memory", action="store_true", dest="profile_with_memory",
                           help="Record memory in the profile (MindSpeed; needs --profile-with-cpu on NPU).")
        group.add_argument("--profile-with-stack", action="store_true", dest="profile_with_stack",
                           help="Record Python call stacks in the profile (MindSpeed).")
        group.add_argument("--profile-record-shapes", action="store_true", dest="profile_record_shapes",
                           help="Record operator input shapes in the profile (MindSpeed).")
        group.add_argument("--profile-save-path", default=None, dest="profile_save_path",
                           help="Where traces go (MindSpeed; default <--tensorboard-dir>/../torch_profile, "
                                f"else {DEFAULT_SAVE_PATH}).")

    def enabled(self, ctx) -> bool:
        if not super().enabled(ctx):
            return False
        return bool(_own_flags_given(ctx.flags)) or (bool(getattr(ctx.flags, "profile", False))
                                                     and ctx.backend.name != "cuda")

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.train_step", _train_step, OWNER)
        pm.register_wrapper("megatron.training.training.train", _train, OWNER)

    def validate(self, args, ctx) -> None:
        from adaptor.profiling import ProfilePlan

        if getattr(args, "profiled_by_adaptor", False):
            return  # validated once already (args.profile is off now)
        given = _own_flags_given(args)
        if not args.profile:
            raise ArgumentError(f"{' '.join(given)} set up the profiler that --profile turns on; add --profile")
        if args.profile_step_end <= args.profile_step_start:
            raise ArgumentError(f"--profile-step-end {args.profile_step_end} must be after --profile-step-start "
                                f"{args.profile_step_start} (the profiled iterations are start..end-1)")
        backend = ctx.backend.name
        if backend == "npu" and args.profile_with_memory and not args.profile_with_cpu:
            raise ArgumentError("--profile-with-memory needs --profile-with-cpu on NPU (torch_npu records memory "
                                "with the host-side operators)")
        if args.pytorch_profiler_collect_chakra:
            raise ArgumentError("--pytorch-profiler-collect-chakra belongs to Megatron's own --use-pytorch-profiler "
                                "path (CUDA, without MindSpeed's --profile-* flags); drop it")
        ranks = tuple(args.profile_ranks or ())
        plan = ProfilePlan(
            backend=backend, start=args.profile_step_start, end=args.profile_step_end,
            ranks=() if -1 in ranks else ranks, save_path=save_path(args), level=args.profile_level or "level0",
            with_cpu=args.profile_with_cpu, with_memory=args.profile_with_memory,
            with_stack=args.profile_with_stack or args.pytorch_profiler_collect_callstack,
            record_shapes=args.profile_record_shapes or args.pytorch_profiler_collect_shapes)
        _state["plan"] = plan
        args.profiled_by_adaptor = True
        args.profile = False  # Megatron's own nsys / torch.profiler paths stay off: this feature profiles
        note = " (--profile-level applies to torch_npu only)" if args.profile_level and backend != "npu" else ""
        notice(f"--profile: {plan.describe()}{note}")
