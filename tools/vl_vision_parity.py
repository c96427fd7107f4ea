"""check_vision_parity.py's Qwen2.5-VL / Qwen3-VL side: the towers on generated images of two sizes.

Two random RGB images (2x2 and 4x6 merged-patch blocks, e.g. 28x28 and 56x84 pixels for Qwen2.5-VL's
14-pixel patches) go through this project's image processor (:mod:`adaptor.mm.qwen_vl.image_processor`)
into one call of each tower: ours (:mod:`adaptor.mm.qwen_vl.vision`, loaded through
:mod:`adaptor.mm.qwen_vl.weights` at the run's TP rank) and transformers' visual module, built from the
directory's ``vision_config`` and given only the vision tensors (not the whole model's). Compared: the
merged image tokens and, for Qwen3-VL, every deepstack output.
"""
from __future__ import annotations

import json
from pathlib import Path

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
BLOCK_GRIDS = ((2, 2), (4, 6))  # patches per image (height, width): merged 2x2, 1 and 6 tokens


def images(config: dict, seed: int):
    """(pixel_values, grid_thw) of two generated images of different sizes."""
    import numpy as np

    from adaptor.mm.qwen_vl.image_processor import image_settings, preprocess

    vision = config["vision_config"]
    side = int(vision["patch_size"])
    rng = np.random.default_rng(seed)
    pictures = [rng.integers(0, 256, (h * side, w * side, 3), dtype=np.uint8) for h, w in BLOCK_GRIDS]
    pixels = max(h * w for h, w in BLOCK_GRIDS) * side * side
    settings = image_settings(config["model_type"], min_pixels=side * side * 4, max_pixels=pixels)
    return preprocess(pictures, settings)


def our_outputs(hf_dir: str, tp: int, rank: int, pixels, grid) -> list:
    """Our tower's merged tokens (and deepstack outputs), on this process's tensor-parallel rank."""
    import torch

    from adaptor.convert import HfCheckpoint
    from adaptor.mm.qwen_vl import weights
    from adaptor.mm.qwen_vl.settings import VisionSettings
    from adaptor.mm.qwen_vl.vision import Qwen3VisionTower, Qwen25VisionTower

    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1234)  # the megatron layers draw initial weights (and attention dropout) from it
    hf = HfCheckpoint(hf_dir)
    settings = VisionSettings.from_hf(hf.config["model_type"], hf.config["vision_config"])
    cls = Qwen3VisionTower if settings.family == "qwen3_vl" else Qwen25VisionTower
    tower = cls(settings, tensor_model_parallel_size=tp, use_cpu_initialization=True)
    prefix = weights.vision_prefix(hf.names())
    weights.load_hf(tower, {n: hf.get(n) for n in hf.names() if n.startswith(prefix)}, tp, rank)
    with torch.no_grad():
        out = tower.eval()(pixels, grid)
    merged, deepstack = out if isinstance(out, tuple) else (out, [])
    return [merged.float(), *(d.float() for d in deepstack)]


def hf_outputs(hf_dir: str, pixels, grid) -> list:
    """transformers' visual module of the directory: its merged tokens (and deepstack features)."""
    import torch
    from transformers import AutoConfig

    from adaptor.convert import HfCheckpoint
    from adaptor.mm.qwen_vl import weights

    config = AutoConfig.from_pretrained(hf_dir)
    if config.model_type == "qwen3_vl":
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel as cls
    else:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as cls
    model = cls._from_config(config.vision_config, dtype=torch.float32, attn_implementation="eager")
    hf = HfCheckpoint(hf_dir)
    prefix = weights.vision_prefix(hf.names())
    model.load_state_dict({n[len(prefix):]: hf.get(n).float() for n in hf.names() if n.startswith(prefix)},
                          strict=True)
    with torch.no_grad():
        out = model.eval()(pixels, grid_thw=grid)
    return [out.pooler_output.float(), *(d.float() for d in (getattr(out, "deepstack_features", None) or []))]


def compare(ours: list, reference: list) -> tuple[float, float]:
    """(max abs difference over every output, max |reference|); ValueError when the shapes differ."""
    if [tuple(t.shape) for t in ours] != [tuple(t.shape) for t in reference]:
        raise ValueError(f"output shapes differ: ours {[tuple(t.shape) for t in ours]}, "
                         f"transformers {[tuple(t.shape) for t in reference]}")
    diff = max((a - b).abs().max().item() for a, b in zip(ours, reference))
    return diff, max(t.abs().max().item() for t in reference)


def check_directory(hf_dir: str, config: dict, tp: int) -> None:
    """ValueError (one line) for a directory whose tower cannot be split over ``tp`` ranks or lacks tensors."""
    from adaptor.convert import HfCheckpoint
    from adaptor.mm.qwen_vl import weights
    from adaptor.mm.qwen_vl.settings import VisionSettings

    settings = VisionSettings.from_hf(config["model_type"], config["vision_config"])
    if settings.num_heads % tp:
        raise ValueError(f"{settings.num_heads} vision attention heads do not split over --tp {tp}")
    hf = HfCheckpoint(hf_dir)
    prefix = weights.vision_prefix(hf.names())
    weights.from_hf({n: hf.get(n) for n in hf.names() if n.startswith(prefix)}, settings, tp, 0)  # mmap: cheap


def save_spec(work: str, hf_dir: str, tp: int, pixels, grid) -> dict:
    import torch

    spec = {"family": "qwen_vl", "hf_dir": hf_dir, "tp": tp, "inputs": str(Path(work) / "inputs.pt"),
            "output": str(Path(work) / "output.pt"), "spec_file": str(Path(work) / "spec.json")}
    torch.save({"pixels": pixels, "grid": grid}, spec["inputs"])
    Path(spec["spec_file"]).write_text(json.dumps(spec))
    return spec
