"""One line at start when ``--bf16`` / ``--fp16`` runs on a CPU without matrix units for that dtype.

Without AVX512-BF16 or AMX-BF16 (``avx512_bf16``, ``amx_bf16`` in /proc/cpuinfo) a bf16 matmul on
the CPU is emulated through fp32 conversions, measured about 15x slower than the same matmul in
fp32 (torch's CPU GEMM, ``torch.mm``, has no fast bf16 path there); fp16 likewise needs AVX512-FP16
or AMX-FP16. Nothing is patched: the run goes on as asked.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__
NEEDS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
NAMES = {"avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16", "avx512_fp16": "AVX512-FP16", "amx_fp16": "AMX-FP16"}


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (empty when unreadable, e.g. not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def slow_precision_warning(dtype: str | None, flags: set[str]) -> str | None:
    """The line to print for a run in ``dtype`` ("bf16", "fp16" or None) on a CPU with ``flags``, or None."""
    if dtype not in NEEDS or not flags or any(f in flags for f in NEEDS[dtype]):
        return None
    units = " or ".join(NAMES[f] for f in NEEDS[dtype])
    return (f"[megatron-adaptor] --{dtype} on this CPU will be slow: it has no {units}, so {dtype} matmuls are "
            f"emulated (about 15x slower than fp32); drop --{dtype} to train in fp32 on this CPU")


class CpuPrecision(Feature):
    name = "cpu_precision"
    backends = ("cpu",)

    def validate(self, args, ctx) -> None:
        dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else None
        line = slow_precision_warning(dtype, cpu_flags())
        if line and getattr(args, "rank", 0) == 0:
            print(line, flush=True)
