"""Model FLOP utilisation: achieved TFLOP/s over the device's peak in the run's dtype.

The peak comes from, in order: ``--device-peak-tflops``; the table below, by the device's name
(``torch.cuda.get_device_name`` / ``torch.npu.get_device_name``); on CPU, a short matmul measured
once per process in the run's dtype at the size of the model's own matmuls. Table figures are
dense (no 2:4 sparsity), per device as torch sees it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# (name fragment, {dtype: dense peak TFLOP/s}); the first fragment found in the device name wins,
# so the more specific names come first. None: no public figure, no MFU.
PEAK_TFLOPS: list[tuple[str, dict[str, float | None]]] = [
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): BF16/FP16 Tensor Core 1,979 TFLOPS
    # with sparsity (dense half), FP32 67 TFLOPS (SXM); H200 NVL 1,671 sparse, FP32 60.
    ("H200 NVL", {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): SXM 1,979 sparse / FP32 67;
    # PCIe 1,513 sparse / FP32 51; NVL 1,671 sparse / FP32 60. Dense matrix figures as tabulated
    # at glennklockwood.com/garden/processors/h100 (BF16 989.4, FP32 66.9).
    ("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): BF16/FP16 Tensor Core 312 TFLOPS
    # dense (624 sparse), FP32 19.5 TFLOPS.
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    # Atlas A3 (Ascend 910C, torch_npu names Ascend910_93xx): Atlas 900 A3 SuperPoD, 384 910C
    # packages at 300 PFLOPS FP16 (Huawei Connect 2025, reported at digitalartspace.ru "Atlas 900 A3
    # SuperPoD"): 781 TFLOPS a package, two dies a package, each die one torch_npu device.
    ("Ascend910_93", {"bf16": 390.6, "fp16": 390.6, "fp32": None}),
    # Atlas A2 (Ascend 910B, Atlas 800T A2): FP16 280 TFLOPS (ai.gitee.com/docs/compute/clusters_gpu/
    # ascend_gpu, "Ascend 910B" spec table); variants B1-B3 clock higher: give --device-peak-tflops.
    ("Ascend910B", {"bf16": 280.0, "fp16": 280.0, "fp32": None}),
]


@dataclass(frozen=True)
class Peak:
    tflops: float | None  # None: unknown, no MFU
    source: str  # says where the figure came from, or why there is none


def run_dtype(args) -> str:
    return "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"


def table_peak(device_name: str, dtype: str) -> float | None:
    for fragment, peaks in PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            return peaks.get(dtype)
    return None


def device_name(device_type: str) -> str:
    module = getattr(torch, device_type, None)
    try:
        return module.get_device_name() if module is not None else ""
    except Exception:
        return ""


_measured: dict[tuple, float] = {}


def measure_cpu_matmul_tflops(m: int, k: int, n: int, dtype: str, seconds: float = 0.3) -> float:
    """Best TFLOP/s of an (m x k) @ (k x n) matmul in ``dtype`` over about ``seconds``; cached per process."""
    key = (m, k, n, dtype)
    if key not in _measured:
        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        a = torch.randn(m, k).to(torch_dtype)
        b = torch.randn(k, n).to(torch_dtype)
        torch.mm(a, b)  # warm-up
        best, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2.0 * m * k * n / (time.perf_counter() - start) / 1e12)
        _measured[key] = best
    return _measured[key]


def model_matmul_shape(args) -> tuple[int, int, int]:
    """A matmul of the model's size class: one micro-batch of tokens through the MLP's first layer."""
    tokens = max(1, args.micro_batch_size * args.seq_length)
    hidden = args.hidden_size
    ffn = args.ffn_hidden_size or 4 * hidden
    return tokens, hidden, ffn


def find_peak(args, device_type: str) -> Peak:
    dtype = run_dtype(args)
    given = getattr(args, "device_peak_tflops", None)
    if given:
        return Peak(given, f"--device-peak-tflops {given:g}")
    if device_type == "cpu":
        m, k, n = model_matmul_shape(args)
        tflops = measure_cpu_matmul_tflops(m, k, n, dtype)
        return Peak(tflops, f"measured on this CPU: {dtype} matmul {m}x{k}x{n} at {tflops * 1e3:.1f} GFLOP/s")
    name = device_name(device_type)
    tflops = table_peak(name, dtype)
    if tflops is None:
        return Peak(None, f"no {dtype} peak is known for {name or device_type!r}; give --device-peak-tflops "
                          f"to print MFU")
    return Peak(tflops, f"{name} {dtype} dense peak {tflops:g} TFLOP/s (table)")


def mfu(achieved_tflops: float, peak: Peak) -> float | None:
    """Achieved over peak (a fraction), or None when the peak is unknown."""
    return achieved_tflops / peak.tflops if peak.tflops else None
