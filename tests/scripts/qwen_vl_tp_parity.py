"""The Qwen2.5-VL and Qwen3-VL vision towers at TP=2 against transformers, on gloo.

    torchrun --nproc_per_node 2 tests/scripts/qwen_vl_tp_parity.py

Every rank builds the same random tiny Hugging Face vision model (4 heads: 2 per rank) and the tower at
TP=2 holding its rank's slices (:func:`adaptor.mm.qwen_vl.weights.load_hf`), runs two images of 4x4 and
8x12 patches in one call and compares the merged tokens (and Qwen3-VL's deepstack outputs) with
transformers' within 1e-5 of the largest. Prints ``CASE <family> ok`` per family and exits non-zero on
the first difference. Not part of the suite (its time budget is spent); run it after changing the
towers' layer spec or the weight layout.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("ADAPTOR_BACKEND", "cpu")
import adaptor  # noqa: F401,E402  (the cpu backend's device and RNG redirections)

TOL = 1e-5
GRID = torch.tensor([[1, 4, 4], [1, 8, 12]])
COMMON = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=40)


def close(name, got, want):
    err = ((got - want).abs().max() / want.abs().max()).item()
    if got.shape != want.shape or err > TOL:
        raise SystemExit(f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)}, relative error {err:.3e}")


def cases():
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    from adaptor.mm.qwen_vl.vision import Qwen3VisionTower, Qwen25VisionTower

    yield ("qwen2_5_vl", Qwen2_5_VLConfig(vision_config=dict(COMMON, window_size=56, fullatt_block_indexes=[1])),
           Qwen2_5_VisionTransformerPretrainedModel, Qwen25VisionTower)
    yield ("qwen3_vl", Qwen3VLConfig(vision_config=dict(COMMON, num_position_embeddings=16,
                                                         deepstack_visual_indexes=[0, 2])),
           Qwen3VLVisionModel, Qwen3VisionTower)


def main():
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from adaptor.mm.qwen_vl import weights
    from adaptor.mm.qwen_vl.settings import VisionSettings

    dist.init_process_group("gloo")
    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(1234)
    rank = ps.get_tensor_model_parallel_rank()
    for family, config, hf_class, tower_class in cases():
        torch.manual_seed(0)
        hf = hf_class._from_config(config.vision_config).eval()
        with torch.no_grad():
            for p in hf.parameters():
                p.normal_(0.0, 0.2)
        settings = VisionSettings.from_hf(family, config.vision_config)
        tower = tower_class(settings, use_cpu_initialization=True, tensor_model_parallel_size=2).eval()
        weights.load_hf(tower, {f"model.visual.{k}": v for k, v in hf.state_dict().items()}, tp=2, rank=rank)
        pixels = torch.randn(int(GRID.prod(-1).sum()), settings.patch_dim, generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            want = hf(pixels, grid_thw=GRID)
            got = tower(pixels, GRID)
        if family == "qwen3_vl":
            got, deepstack = got
            for i, (ours, ref) in enumerate(zip(deepstack, want.deepstack_features, strict=True)):
                close(f"{family} deepstack {i}", ours, ref)
        close(family, got, want.pooler_output)
        if rank == 0:
            print(f"CASE {family} ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
