"""Peak memory and wall time of tools/convert_ckpt.py on a Qwen3-0.6B-shaped checkpoint (>= 1 GB of weights).

    python benchmarks/convert_memory.py --work-dir /tmp/convert_bench

Writes a random bf16 Qwen3 checkpoint (hidden 1024, 28 layers, 16 heads / 8 groups of
128, ffn 3072, vocab 151936, tied: 0.6 B parameters, 1.19 GB) as Hub shards, then runs
hf -> mg at TP1 and TP2 and mg -> hf (from TP2), each in its own process. For each, it
samples /proc/<pid>/status every 10 ms and reports the peak resident set (VmHWM: includes
memory-mapped checkpoint pages the kernel can drop at any time) and the peak anonymous
resident memory (RssAnon: memory the process itself allocated), against the weights' size.
The round trip is checked bit-exact at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "tie_word_embeddings": True, "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
}


def layer_shapes(c: dict, i: int) -> dict[str, tuple[int, ...]]:
    h, d, f = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
        p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
        p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f),
    }


def write_model(path: Path, layers_per_shard: int = 7) -> int:
    """Shard by shard, so generating needs one shard in memory; returns the weights' bytes."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(CONFIG, indent=2))
    c = CONFIG
    groups = [{"model.embed_tokens.weight": (c["vocab_size"], c["hidden_size"]),
               "model.norm.weight": (c["hidden_size"],)}]
    for start in range(0, c["num_hidden_layers"], layers_per_shard):
        shapes = {}
        for i in range(start, min(start + layers_per_shard, c["num_hidden_layers"])):
            shapes.update(layer_shapes(c, i))
        groups.append(shapes)
    weight_map, total = {}, 0
    generator = torch.Generator().manual_seed(0)
    for n, shapes in enumerate(groups):
        file = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {k: (torch.randn(s, generator=generator) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}
        save_file(tensors, str(path / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({k: file for k in tensors})
        del tensors
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return total


def status_kb(pid: int) -> dict[str, int]:
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "RssAnon"):
                values[key] = int(rest.split()[0])
    return values


def measure(args: list[str]) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "convert_ckpt.py")] + args, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_hwm = peak_anon = 0
    while proc.poll() is None:
        try:
            values = status_kb(proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        peak_hwm = max(peak_hwm, values.get("VmHWM", 0))
        peak_anon = max(peak_anon, values.get("RssAnon", 0))
        time.sleep(0.01)
    output = proc.communicate()[0]
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"conversion failed: {output}")
    return {"wall_s": wall, "peak_rss_mb": peak_hwm / 1024, "peak_anon_mb": peak_anon / 1024}


def import_baseline() -> dict:
    """The same process doing nothing but importing the tool's modules (adaptor imports megatron)."""
    code = "import sys; sys.argv=['x']; import warnings; warnings.filterwarnings('ignore'); import adaptor.convert"
    proc = subprocess.Popen([sys.executable, "-c", code + "; import time; time.sleep(1)"], cwd=ROOT,
                            env=dict(os.environ, OMP_NUM_THREADS="1", ADAPTOR_QUIET="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak_hwm = peak_anon = 0
    while proc.poll() is None:
        try:
            values = status_kb(proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        peak_hwm = max(peak_hwm, values.get("VmHWM", 0))
        peak_anon = max(peak_anon, values.get("RssAnon", 0))
        time.sleep(0.01)
    return {"peak_rss_mb": peak_hwm / 1024, "peak_anon_mb": peak_anon / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default="/tmp/convert_bench")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints")
    args = parser.parse_args()
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    hf = work / "hf"
    weights = write_model(hf)
    print(f"weights: {weights / 1e9:.2f} GB ({weights / 2**20:.0f} MiB) bf16, Qwen3-0.6B shape")
    base = import_baseline()
    print(f"import baseline (python + torch + megatron + adaptor, no conversion): "
          f"peak RSS {base['peak_rss_mb']:.0f} MiB, anonymous {base['peak_anon_mb']:.0f} MiB")
    runs = [
        ("hf -> mg TP1", ["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
                          "--load-dir", str(hf), "--save-dir", str(work / "mg_tp1")]),
        ("hf -> mg TP2", ["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
                          "--load-dir", str(hf), "--save-dir", str(work / "mg_tp2"),
                          "--target-tensor-parallel-size", "2"]),
        ("mg TP2 -> hf", ["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(work / "mg_tp2"),
                          "--save-dir", str(work / "hf_back"), "--max-shard-size", "500MB"]),
    ]
    print(f"{'step':<14} {'wall s':>7} {'peak RSS MiB':>13} {'peak anon MiB':>14} "
          f"{'RSS over baseline / weights':>28}")
    for label, run_args in runs:
        r = measure(run_args)
        over = (r["peak_rss_mb"] - base["peak_rss_mb"]) * 2**20 / weights
        print(f"{label:<14} {r['wall_s']:7.1f} {r['peak_rss_mb']:13.0f} {r['peak_anon_mb']:14.0f} {over:28.2f}",
              flush=True)
    sys.path.insert(0, str(ROOT))
    from adaptor.convert import HfCheckpoint
    a, b = HfCheckpoint(hf), HfCheckpoint(work / "hf_back")
    exact = sorted(a.names()) == sorted(b.names()) and all(torch.equal(a.get(n), b.get(n)) for n in a.names())
    print(f"round trip bit-exact: {exact}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
