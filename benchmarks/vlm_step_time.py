"""Step time of the tiny vision-language example (pretrain_mm.py) per layout, from Megatron's own log.

    python benchmarks/vlm_step_time.py [--iters 40] [--warmup 10] [--backend cpu] [--only NAME ...]

Each configuration is one run of `bash examples/vlm/pretrain.sh` (examples/vlm/model.json: CLIP-style
tower 2 layers / hidden 64 on 32x32 images in 16 patches, MLP projector, Qwen3-style decoder 2 layers
/ hidden 128; seq 48 of which 16 are image embeddings; global batch 16; the embedded shapes dataset,
decoded by Pillow in one DataLoader worker), with NPROC/TP set and extra flags for the "frozen" row.
Megatron prints "elapsed time per iteration (ms)" every iteration; we report the median after the
warm-up iterations and the images per second it implies.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from train_step_time import measure  # noqa: E402

GLOBAL_BATCH = 16  # examples/vlm/pretrain.sh's default: one image per sample


def frozen_model_json(directory: str) -> str:
    """The example's model.json with the vision tower and the text decoder frozen (projector trains)."""
    model = json.loads((ROOT / "examples" / "vlm" / "model.json").read_text())
    model["image_encoder"]["vision_encoder"]["freeze"] = True
    model["text_decoder"]["freeze"] = True
    path = Path(directory) / "model_frozen.json"
    path.write_text(json.dumps(model))
    return str(path)


CONFIGS = {  # name: (processes, extra environment for the example script)
    "1 proc fp32": (1, {}),
    "1 proc fp32, tower + decoder frozen": (1, {"MM_MODEL": "frozen"}),
    "TP=2 fp32": (2, {"TP": "2"}),
    "DP=2 fp32 + distributed optimizer": (2, {}),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "npu"])
    ap.add_argument("--only", nargs="+", choices=sorted(CONFIGS), help="run just these configurations")
    a = ap.parse_args()
    print(f"# {date.today()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores · "
          f"backend {a.backend} · median of iterations {a.warmup + 1}..{a.iters}")
    print("| configuration | ms / iteration | images / s |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for name, (nproc, extra) in CONFIGS.items():
            if a.only and name not in a.only:
                continue
            extra = {k: (frozen_model_json(work) if v == "frozen" else v) for k, v in extra.items()}
            ms = measure(nproc, extra, [], a.iters, a.warmup, a.backend, script="examples/vlm/pretrain.sh")
            print(f"| {name} | {ms:.1f} | {GLOBAL_BATCH / ms * 1000:.0f} |", flush=True)


if __name__ == "__main__":
    main()
