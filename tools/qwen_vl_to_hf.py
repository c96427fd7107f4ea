#!/usr/bin/env python
"""Write a Hugging Face directory from a pretrain_mm.py checkpoint of Qwen2.5-VL or Qwen3-VL.

    python tools/qwen_vl_to_hf.py --load ckpt --mm-model model.json --save-dir out [--iteration 1000]

The checkpoint is ``--ckpt-format torch`` (``iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt``) at any
TP/PP; model.json gives the architecture (config.json is written from it) and, with
``init_from_hf_path``, the tensor names to write (that directory's). Tensors are joined exactly: a
checkpoint of an unchanged model gives back the initial directory's tensors bit for bit.
Bad input is one line ``qwen_vl_to_hf.py: error: ...`` and exit 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROG = "qwen_vl_to_hf.py"


def error(message: str):
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def iteration_dir(load: Path, iteration: int | None) -> Path:
    if iteration is None:
        tracker = load / "latest_checkpointed_iteration.txt"
        if not tracker.is_file():
            error(f"--load {load}: no latest_checkpointed_iteration.txt (give --iteration)")
        text = tracker.read_text().strip()
        return load / ("release" if text == "release" else f"iter_{int(text):07d}")
    return load / f"iter_{iteration:07d}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", required=True, type=Path, help="the pretrain_mm.py --save directory")
    parser.add_argument("--mm-model", required=True, help="the run's model.json")
    parser.add_argument("--save-dir", required=True, type=Path, help="the Hugging Face directory to write")
    parser.add_argument("--iteration", type=int, default=None, help="default: the latest")
    opts = parser.parse_args(argv)

    from adaptor.convert import ConversionError, HfCheckpoint
    from adaptor.mm.config import MMConfigError, load_model_config
    from adaptor.mm.qwen_vl.checkpoint import checkpoint_layout, hf_state_from_checkpoint, save_tensors

    try:
        model_cfg = load_model_config(opts.mm_model)
    except MMConfigError as exc:
        error(str(exc))
    if model_cfg.hf_config is None:
        error(f"--mm-model {opts.mm_model}: model_id {model_cfg.model_id} is not Qwen2.5-VL or Qwen3-VL")
    step = iteration_dir(opts.load, opts.iteration)
    like = HfCheckpoint(model_cfg.init_from_hf_path) if model_cfg.init_from_hf_path else None
    try:
        layout = checkpoint_layout(step)
        tensors = hf_state_from_checkpoint(step, model_cfg.hf_config, like=like)
    except (ConversionError, ValueError, KeyError, OSError) as exc:
        error(f"--load {opts.load}: {exc}")
    save_tensors(tensors, model_cfg.hf_config, opts.save_dir)
    print(f"{PROG}: {len(tensors)} tensors of {step} (TP {layout.tp}, PP {layout.pp}) written to {opts.save_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
