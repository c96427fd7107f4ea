"""STAND-IN for ``torch_npu.profiler``, NOT Ascend's profiler: its documented names and signatures,
delegating to ``torch.profiler`` on the CPU so the adaptor's NPU profiling path runs in tests.

Signatures as documented in Ascend Extension for PyTorch's API reference (hiascend.com,
"torch_npu.profiler.profile", "torch_npu.profiler._ExperimentalConfig", "torch_npu.profiler.ProfilerLevel",
"torch_npu.profiler.tensorboard_trace_handler"). No NPU activity is recorded: a trace holds the CPU
operators only, and ``tensorboard_trace_handler`` writes torch's Chrome trace JSON, not Ascend's layout.
"""
from __future__ import annotations

import enum

import torch.profiler as _torch_profiler


class ProfilerActivity(enum.Enum):
    CPU = "CPU"  # framework-side (host) events
    NPU = "NPU"  # CANN and NPU events


class ProfilerLevel(enum.Enum):
    Level_none = "Level_none"
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"


class AiCMetrics(enum.Enum):
    AiCoreNone = "AiCoreNone"
    PipeUtilization = "PipeUtilization"
    ArithmeticUtilization = "ArithmeticUtilization"
    Memory = "Memory"
    MemoryL0 = "MemoryL0"
    MemoryUB = "MemoryUB"
    ResourceConflictRatio = "ResourceConflictRatio"
    L2Cache = "L2Cache"


class ExportType(enum.Enum):
    Text = "text"
    Db = "db"


class _ExperimentalConfig:
    def __init__(self, profiler_level=ProfilerLevel.Level0, aic_metrics=AiCMetrics.AiCoreNone, l2_cache=False,
                 op_attr=False, data_simplification=True, record_op_args=False, export_type=ExportType.Text,
                 msprof_tx=False):
        if not isinstance(profiler_level, ProfilerLevel):
            raise TypeError(f"profiler_level must be a torch_npu.profiler.ProfilerLevel, got {profiler_level!r}")
        if not isinstance(aic_metrics, AiCMetrics):
            raise TypeError(f"aic_metrics must be a torch_npu.profiler.AiCMetrics, got {aic_metrics!r}")
        self.profiler_level = profiler_level
        self.aic_metrics = aic_metrics
        self.l2_cache = l2_cache
        self.op_attr = op_attr
        self.data_simplification = data_simplification
        self.record_op_args = record_op_args
        self.export_type = export_type
        self.msprof_tx = msprof_tx


#: every profile() made here, for tests to inspect: (activities, experimental_config, kwargs)
made: list = []

schedule = _torch_profiler.schedule


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None, analyse_flag: bool = True):
    return _torch_profiler.tensorboard_trace_handler(dir_name, worker_name=worker_name)


class profile(_torch_profiler.profile):  # noqa: N801 (torch_npu's name)
    def __init__(self, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
                 profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
                 experimental_config=None, use_cuda=None):
        activities = list(activities) if activities is not None else [ProfilerActivity.CPU, ProfilerActivity.NPU]
        if not activities or not all(isinstance(a, ProfilerActivity) for a in activities):
            raise TypeError(f"activities must be torch_npu.profiler.ProfilerActivity members, got {activities!r}")
        if experimental_config is not None and not isinstance(experimental_config, _ExperimentalConfig):
            raise TypeError("experimental_config must be a torch_npu.profiler._ExperimentalConfig")
        made.append((activities, experimental_config, dict(record_shapes=record_shapes,
                                                           profile_memory=profile_memory, with_stack=with_stack)))
        # the stand-in records host operators whatever the activities: there is no NPU to record
        super().__init__(activities=[_torch_profiler.ProfilerActivity.CPU], schedule=schedule,
                         on_trace_ready=on_trace_ready, record_shapes=record_shapes,
                         profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops,
                         with_modules=with_modules)
