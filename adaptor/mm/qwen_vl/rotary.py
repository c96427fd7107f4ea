"""Multimodal rotary embeddings whose frequency channels read the temporal, height or width position.

A head of ``d`` channels rotates ``d / 2`` frequency pairs; with 3-D positions each pair takes its angle
from one of the three axes. Which one is a fixed table per model:

* sectioned (Qwen2-VL, Qwen2.5-VL): the first ``mrope_section[0]`` frequencies read the temporal axis,
  the next ``mrope_section[1]`` the height, the last ``mrope_section[2]`` the width. megatron-core's
  ``MultimodalRotaryEmbedding`` builds this one, and the decoder uses it.
* interleaved (Qwen3-VL, ``mrope_interleaved``): frequency ``f`` reads the height when ``f % 3 == 1`` and
  ``f < 3 * mrope_section[1]``, the width when ``f % 3 == 2`` and ``f < 3 * mrope_section[2]``, the temporal
  axis otherwise. megatron-core has no such table, hence :class:`AxisTableRotaryEmbedding`.

The module returns what megatron-core's rotary modules return, the angles ``[s, b, 1, d]`` (the ``d / 2``
angles twice, for the rotate-half layout), so ``GPTModel`` and its attention apply it unchanged.
"""
from __future__ import annotations

import torch
from torch import nn


def frequency_axes(mrope_section, interleaved: bool) -> torch.Tensor:
    """The axis (0 temporal, 1 height, 2 width) each of the ``sum(mrope_section)`` frequencies reads."""
    section = [int(s) for s in mrope_section]
    if len(section) != 3:
        raise ValueError(f"mrope_section {section} must have three entries (temporal, height, width)")
    if not interleaved:
        return torch.repeat_interleave(torch.arange(3), torch.tensor(section))
    axes = torch.zeros(sum(section), dtype=torch.long)
    for axis in (1, 2):
        axes[axis:3 * section[axis]:3] = axis
    return axes


class AxisTableRotaryEmbedding(nn.Module):
    """Rotary angles for 3-D positions under a frequency-to-axis table (:func:`frequency_axes`).

    Called as ``GPTModel`` calls its ``mrope`` rotary module: ``(position_ids [3, b, s], mrope_section,
    cp_group=None)``; the section given at construction is the one used.
    """

    def __init__(self, kv_channels: int, rotary_base: float, mrope_section, interleaved: bool = True,
                 cp_group=None):
        super().__init__()
        axes = frequency_axes(mrope_section, interleaved)
        if 2 * len(axes) != kv_channels:
            raise ValueError(f"mrope_section {list(mrope_section)} sums to {len(axes)}, not half the head "
                             f"dimension {kv_channels}")
        exponents = torch.arange(0, kv_channels, 2, dtype=torch.float32) / kv_channels
        # A plain attribute, as megatron-core keeps it: a buffer would follow the model to bf16.
        self.inv_freq = 1.0 / (rotary_base ** exponents)
        self.register_buffer("axes", axes, persistent=False)
        self.mrope_section = list(mrope_section)
        self.cp_group = cp_group

    def forward(self, position_ids: torch.Tensor, mrope_section=None, cp_group=None) -> torch.Tensor:
        if position_ids.dim() != 3 or position_ids.shape[0] != 3:
            raise ValueError(f"position_ids of shape {tuple(position_ids.shape)}; 3-D rotary takes (3, batch, seq)")
        # (3, b, s, d/2): every axis's angle for every frequency; then each frequency keeps its own axis.
        angles = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)
        index = self.axes.to(position_ids.device).expand(1, *angles.shape[1:])
        chosen = angles.gather(0, index)[0]
        emb = torch.cat((chosen, chosen), dim=-1).transpose(0, 1)[:, :, None, :].contiguous()
        group = cp_group if cp_group is not None else self.cp_group
        if group is None:
            from megatron.core import parallel_state

            group = parallel_state.get_context_parallel_group(check_initialized=False)
        if group is not None and group.size() > 1:
            from megatron.core.models.common.embeddings.rotary_pos_embedding import get_pos_emb_on_this_cp_rank

            emb = get_pos_emb_on_this_cp_rank(emb, 0, group)
        return emb
