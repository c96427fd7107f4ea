"""Compare our vision tower, loaded from a Hugging Face directory, with transformers' (CLIP, SigLIP, Qwen-VL).

    python tools/check_vision_parity.py --hf-dir /models/clip-vit-large-patch14-336 --tp 2
    python tools/check_vision_parity.py --hf-dir tiny_siglip
    python tools/check_vision_parity.py --hf-dir /models/Qwen2.5-VL-7B-Instruct --tp 2

One fixed random image batch, fp32: transformers' ``last_hidden_state`` (``CLIPVisionModel`` /
``SiglipVisionModel``, eager) here, and megatron-core's ``CLIPViTModel`` built as pretrain_mm.py does
(:func:`adaptor.mm.model.build_vision_tower`) at ``--tp``, loaded by :mod:`adaptor.mm.weights`, under
torchrun (``ADAPTOR_BACKEND``, default cpu/gloo).

A Qwen2.5-VL / Qwen3-VL directory (``model_type`` qwen2_5_vl / qwen3_vl) compares our tower
(:mod:`adaptor.mm.qwen_vl.vision`) with transformers' visual module on two generated images of different
sizes, merged tokens and deepstack outputs (tools/vl_vision_parity.py). Called in a process whose
model-parallel groups are already set up at ``--tp`` (as tests do), ours runs in that process; otherwise
under torchrun as above.

Prints the max abs difference and exits 1 past ``--tolerance``; bad input is one line
``check_vision_parity.py: error: ...`` and exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROG = "check_vision_parity.py"
MODEL_IDS = {"clip_vision_model": "clip", "clip": "clip", "siglip_vision_model": "siglip", "siglip": "siglip"}


def error(message: str, code: int = 2):
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-dir", required=True, help="Hugging Face CLIP/SigLIP directory (config.json + safetensors)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="bound on the max abs difference")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234, help="seed of the random image batch")
    parser.add_argument("--timeout", type=int, default=600, help="seconds for the Megatron run")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def vision_encoder_keys(hf_dir: str, config: dict) -> dict:
    """model.json's vision_encoder section describing the whole checkpoint's tower."""
    from adaptor.convert.clip_vision import vision_config, vision_mapping

    model_id = MODEL_IDS.get(config.get("model_type"))
    if model_id is None:
        error(f"--hf-dir {hf_dir}: model_type {config.get('model_type')!r} is not a CLIP or SigLIP model")
    mapping = vision_mapping(model_id, config)
    if int(vision_config(config).get("num_channels", 3)) != 3:
        error(f"--hf-dir {hf_dir}: num_channels must be 3 (megatron-core's patch convolution takes RGB)")
    return {"model_id": model_id, "num_layers": mapping.layers_in_checkpoint, **mapping.model_json_values(),
            "drop_class_token": False, "hidden_dropout": 0.0, "attention_dropout": 0.0, "freeze": False,
            "ckpt_path": hf_dir}


def hf_output(hf_dir: str, model_id: str, images):
    import torch
    from transformers import CLIPVisionModel, SiglipVisionModel

    cls = CLIPVisionModel if model_id == "clip" else SiglipVisionModel
    model = cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(pixel_values=images).last_hidden_state.float()


def main(argv=None) -> int:
    opts = parse_args(argv)
    if opts.worker:
        return worker(opts.worker)
    hf_dir = Path(opts.hf_dir)
    if not (hf_dir / "config.json").is_file():
        error(f"--hf-dir {opts.hf_dir}: no config.json there")
    for name in ("tp", "batch"):
        if getattr(opts, name) < 1:
            error(f"--{name} must be at least 1")
    os.environ.setdefault("ADAPTOR_QUIET", "1")
    import torch

    from adaptor.convert import ConversionError, HfCheckpoint, Layout
    from adaptor.convert.clip_vision import vision_mapping

    config = json.loads((hf_dir / "config.json").read_text())
    if config.get("model_type") in ("qwen2_5_vl", "qwen3_vl"):
        return qwen_vl_main(opts, config)
    try:
        HfCheckpoint(str(hf_dir)).names()
        vision = vision_encoder_keys(str(hf_dir.resolve()), config)
        vision_mapping(vision["model_id"], config).check_layout(Layout(tp=opts.tp))
    except ConversionError as exc:
        error(f"--hf-dir {opts.hf_dir}: {str(exc).replace('--tensor-model-parallel-size', '--tp')}")
    size = vision["image_size"]
    images = torch.randn(opts.batch, 3, size, size, generator=torch.Generator().manual_seed(opts.seed))
    with tempfile.TemporaryDirectory(prefix="vision_parity_") as work:
        spec = {"vision": vision, "tp": opts.tp, "images": str(Path(work) / "images.pt"),
                "output": str(Path(work) / "output.pt"), "spec_file": str(Path(work) / "spec.json")}
        torch.save(images, spec["images"])
        Path(spec["spec_file"]).write_text(json.dumps(spec))
        run_megatron(spec, opts.tp, opts.timeout)
        megatron = torch.load(spec["output"])
    reference = hf_output(str(hf_dir), vision["model_id"], images)
    if megatron.shape != reference.shape:
        error(f"output shapes differ: Megatron {tuple(megatron.shape)}, transformers {tuple(reference.shape)}")
    diff = (megatron - reference).abs().max().item()
    scale = reference.abs().max().item()
    verdict = "ok" if diff <= opts.tolerance else "FAILED"
    print(f"{PROG}: {vision['model_id']} {opts.hf_dir} tp={opts.tp}: max abs difference {diff:.3e} "
          f"(max |output| {scale:.3e}, tolerance {opts.tolerance:g}, {opts.batch} images {size}x{size}): {verdict}",
          flush=True)
    return 0 if diff <= opts.tolerance else 1


def in_process_at(tp: int) -> bool:
    """Whether this process already has Megatron's model-parallel groups at tensor-parallel size ``tp``."""
    import torch
    from megatron.core import parallel_state

    return (torch.distributed.is_initialized() and parallel_state.model_parallel_is_initialized()
            and parallel_state.get_tensor_model_parallel_world_size() == tp)


def qwen_vl_main(opts, config: dict) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vl_vision_parity as vl

    from adaptor.convert import ConversionError

    hf_dir = str(Path(opts.hf_dir).resolve())
    try:
        vl.check_directory(hf_dir, config, opts.tp)
        pixels, grid = vl.images(config, opts.seed)
    except (ConversionError, ValueError, KeyError) as exc:
        error(f"--hf-dir {opts.hf_dir}: {exc}")
    if in_process_at(opts.tp):
        from megatron.core import parallel_state

        ours = vl.our_outputs(hf_dir, opts.tp, parallel_state.get_tensor_model_parallel_rank(), pixels, grid)
    else:
        import torch

        with tempfile.TemporaryDirectory(prefix="vision_parity_") as work:
            spec = vl.save_spec(work, hf_dir, opts.tp, pixels, grid)
            run_megatron(spec, opts.tp, opts.timeout, hf_dir)
            ours = torch.load(spec["output"])
    try:
        diff, scale = vl.compare(ours, vl.hf_outputs(hf_dir, pixels, grid))
    except ValueError as exc:
        error(str(exc))
    verdict = "ok" if diff <= opts.tolerance else "FAILED"
    sizes = ", ".join(f"{int(h) * int(config['vision_config']['patch_size'])}x"
                      f"{int(w) * int(config['vision_config']['patch_size'])}" for _, h, w in grid.tolist())
    print(f"{PROG}: {config['model_type']} {opts.hf_dir} tp={opts.tp}: max abs difference {diff:.3e} over "
          f"{len(ours)} output(s) (max |output| {scale:.3e}, tolerance {opts.tolerance:g}, images {sizes}): "
          f"{verdict}", flush=True)
    return 0 if diff <= opts.tolerance else 1


def run_megatron(spec: dict, nproc: int, timeout: int, hf_dir: str | None = None) -> None:
    from adaptor.env import torchrun_command
    from adaptor.rendezvous import rendezvous_port

    cmd = [*torchrun_command(), f"--nproc_per_node={nproc}",
           f"--master_port={rendezvous_port()}", str(Path(__file__).resolve()), "--hf-dir", hf_dir or spec["vision"]["ckpt_path"],
           "--worker", spec["spec_file"]]
    env = dict(os.environ, PYTHONUNBUFFERED="1", ADAPTOR_QUIET="1")
    env.setdefault("ADAPTOR_BACKEND", "cpu")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        reason = next((line for line in lines if ": error: " in line),
                      next((line for line in lines if line.startswith("[rank") and "Error" in line),
                           lines[-1] if lines else ""))
        sys.stderr.write("\n".join(lines[-40:]) + "\n")
        error(f"the Megatron run failed (exit {proc.returncode}): {reason}")


# ----------------------------------------------------------------------------- torchrun worker
def worker(spec_file: str) -> int:
    spec = json.loads(Path(spec_file).read_text())
    sys.argv = sys.argv[:1]
    sys.path.insert(0, str(ROOT))
    from adaptor.bootstrap import setup

    setup()  # patches megatron for this backend

    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    from adaptor.convert import ConversionError
    from adaptor.errors import fail
    from adaptor.mm.model import build_vision_tower
    from adaptor.mm.weights import copy_into, vision_tower_tensors

    from adaptor import run_state

    backend = run_state.backend()
    torch.distributed.init_process_group(backend=backend.dist_backend)
    if backend.name != "cpu":
        getattr(torch, backend.name).set_device(int(os.environ.get("LOCAL_RANK", 0)))
    tp = spec["tp"]
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(1234)
    if spec.get("family") == "qwen_vl":
        return qwen_vl_worker(spec)
    vision = spec["vision"]
    base = TransformerConfig(
        num_layers=1, hidden_size=vision["hidden_size"], num_attention_heads=vision["num_attention_heads"],
        tensor_model_parallel_size=tp, use_cpu_initialization=True, bias_activation_fusion=False,
        masked_softmax_fusion=False, bias_dropout_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False, apply_rope_fusion=False)
    model = build_vision_tower(argparse.Namespace(transformer_impl="local"), vision, base)
    try:
        copy_into(model, vision_tower_tensors(vision["ckpt_path"], vision, tp,
                                              parallel_state.get_tensor_model_parallel_rank()), "vision tower")
    except ConversionError as exc:
        fail(f"--hf-dir {vision['ckpt_path']}: {exc}")
    device = "cpu" if backend.name == "cpu" else torch.device(backend.name, int(os.environ.get("LOCAL_RANK", 0)))
    model = model.to(device).eval()
    with torch.no_grad():
        output = model(torch.load(spec["images"]).to(device))
    if torch.distributed.get_rank() == 0:
        torch.save(output.float().cpu(), spec["output"])
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


def qwen_vl_worker(spec: dict) -> int:
    """This rank's Qwen-VL tower on the saved images (CPU: the towers' attention runs there as in tests)."""
    import torch
    from megatron.core import parallel_state

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vl_vision_parity as vl

    inputs = torch.load(spec["inputs"])
    ours = vl.our_outputs(spec["hf_dir"], spec["tp"], parallel_state.get_tensor_model_parallel_rank(),
                          inputs["pixels"], inputs["grid"])
    if torch.distributed.get_rank() == 0:
        torch.save(ours, spec["output"])
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
