"""The Qwen2.5-VL and Qwen3-VL vision towers on megatron-core blocks.

Both take the processor's output, ``pixel_values [patches, C*T*P*P]`` of any number of images packed
in one sequence and ``grid_thw [images, 3]``, and return one token per ``m x m`` patch block, images in
order, ready to replace the image placeholders of the text:

* :class:`Qwen25VisionTower`: a linear patch embedding (a 3-D convolution whose stride equals its
  kernel is a matrix product), 2-D rotary positions, RMSNorm blocks with a gated SiLU MLP that attend
  inside windows of ``window_size`` pixels except the ``fullatt_block_indexes`` blocks, which attend over
  the whole image; the sequence is put in window order once before the blocks (so each window is one
  contiguous segment) and the merged tokens are put back in image order after the merger.
* :class:`Qwen3VisionTower`: the patch embedding with a bias, a learned square position table resampled
  bilinearly to each image and added, 2-D rotary positions, LayerNorm blocks with a plain MLP over the
  whole image, and after each of the ``deepstack_visual_indexes`` blocks an extra merger whose output
  the decoder adds to its early hidden states.

Blocks take megatron's ``[sequence, batch=1, hidden]``; a boolean block-diagonal mask keeps each image
(or window) to itself.
"""
from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import build_module

from adaptor.mm.qwen_vl import vision_grid as positions
from adaptor.mm.qwen_vl.layers import PatchMerger, block_config, block_spec, merger_config
from adaptor.mm.qwen_vl.settings import VisionSettings


class _VisionTower(MegatronModule):
    """What both towers share: patch embedding, the megatron blocks, the main merger, input checks."""

    family = ""

    def __init__(self, settings: VisionSettings, **config_overrides):
        if settings.family != self.family:
            raise ValueError(f"{type(self).__name__} builds {self.family}, the settings describe {settings.family}")
        config = block_config(settings, **config_overrides)
        super().__init__(config=config)
        self.settings = settings
        self.patch_embed = torch.nn.Linear(settings.patch_dim, settings.hidden_size,
                                           bias=settings.family == "qwen3_vl", dtype=config.params_dtype)
        spec = block_spec()
        self.layers = torch.nn.ModuleList(
            build_module(spec, config=config, layer_number=i + 1, add_layer_offset=False)
            for i in range(settings.depth))
        self.merger_config = merger_config(settings, **config_overrides)
        self.merger = PatchMerger(settings, self.merger_config)

    def _embed(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        s = self.settings
        positions.check_input(pixel_values, grid_thw, s.patch_dim, s.spatial_merge_size)
        return self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype))

    def _rotary(self, grid_thw: torch.Tensor, device) -> torch.Tensor:
        s = self.settings
        coordinates = positions.patch_coordinates(grid_thw, s.spatial_merge_size)
        return positions.rotary_angles(coordinates, s.head_dim, s.rope_theta).to(device)

    @staticmethod
    def _mask(lengths: list[int], device):
        """The block-diagonal mask, or None when one segment spans the sequence."""
        return positions.segment_mask(lengths, device) if len(lengths) > 1 else None

    def _block(self, index: int, x: torch.Tensor, mask, angles: torch.Tensor) -> torch.Tensor:
        """One megatron block over [patches, hidden] (megatron's [s, b=1, h] inside)."""
        out, _ = self.layers[index](x[:, None], attention_mask=mask, rotary_pos_emb=angles[:, None, None])
        return out[:, 0]


class Qwen25VisionTower(_VisionTower):
    """Qwen2.5-VL's vision encoder and its ``lnmlp`` merger: ``(pixel_values, grid_thw) -> tokens``."""

    family = "qwen2_5_vl"

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """[patches, C*T*P*P] -> [patches / m^2, out_hidden_size], merged tokens in image order."""
        s = self.settings
        x = self._embed(pixel_values, grid_thw)
        angles = self._rotary(grid_thw, x.device)
        full = self._mask(positions.frame_lengths(grid_thw), x.device)
        windowed = [i for i in range(s.depth) if i not in s.fullatt_block_indexes]
        order = None
        if windowed:
            order, lengths = positions.window_order(grid_thw, s.spatial_merge_size,
                                                    s.window_size // (s.patch_size * s.spatial_merge_size))
            order = order.to(x.device)
            x = positions.reorder_patches(x, order, s.merge_unit)
            angles = positions.reorder_patches(angles, order, s.merge_unit)
            window = self._mask(lengths, x.device)
        for i in range(s.depth):
            x = self._block(i, x, window if i in windowed else full, angles)
        merged = self.merger(x)
        return merged if order is None else merged[torch.argsort(order)]


class Qwen3VisionTower(_VisionTower):
    """Qwen3-VL's vision model: ``(pixel_values, grid_thw) -> (tokens, [deepstack tokens per index])``."""

    family = "qwen3_vl"

    def __init__(self, settings: VisionSettings, **config_overrides):
        super().__init__(settings, **config_overrides)
        self.pos_embed = torch.nn.Embedding(settings.num_position_embeddings, settings.hidden_size,
                                            dtype=self.config.params_dtype)
        self.deepstack_mergers = torch.nn.ModuleList(
            PatchMerger(settings, self.merger_config, norm_after_join=True)
            for _ in settings.deepstack_visual_indexes)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """[patches, C*T*P*P] -> ([patches / m^2, out_hidden_size], deepstack outputs of the same shape)."""
        s = self.settings
        x = self._embed(pixel_values, grid_thw)
        side = round(s.num_position_embeddings ** 0.5)
        indices, weights = positions.interpolation_taps(grid_thw, side, s.spatial_merge_size)
        table = self.pos_embed(indices.to(x.device)) * weights.to(x.device, self.pos_embed.weight.dtype)[..., None]
        x = x + table.sum(1).to(x.dtype)
        angles = self._rotary(grid_thw, x.device)
        mask = self._mask(positions.frame_lengths(grid_thw), x.device)
        deepstack = []
        for i in range(s.depth):
            x = self._block(i, x, mask, angles)
            if i in s.deepstack_visual_indexes:
                deepstack.append(self.deepstack_mergers[s.deepstack_visual_indexes.index(i)](x))
        return self.merger(x), deepstack
