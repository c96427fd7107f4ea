"""The vision towers' hyper-parameters, one frozen record for both families.

Read from a Hugging Face ``vision_config`` (a dict, as config.json holds it, or the config object), so
that a checkpoint's own numbers build the tower that loads it. Qwen2.5-VL and Qwen3-VL name the same
things alike; what only one of them has keeps a neutral default in the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field

FAMILIES = ("qwen2_5_vl", "qwen3_vl")


@dataclass(frozen=True)
class VisionSettings:
    family: str  # "qwen2_5_vl": RMSNorm, gated SiLU MLP, windows; "qwen3_vl": LayerNorm, learned positions, deepstack
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    hidden_act: str = "silu"
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    window_size: int = 0  # pixels on a side; 0: no windowed layers
    fullatt_block_indexes: tuple = field(default_factory=tuple)
    num_position_embeddings: int = 0
    deepstack_visual_indexes: tuple = field(default_factory=tuple)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"vision family {self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ValueError(f"hidden_size {self.hidden_size} over {self.num_heads} heads must give a head size "
                             f"divisible by 4 (two axes of rotary pairs)")
        for name in ("fullatt_block_indexes", "deepstack_visual_indexes"):
            bad = [i for i in getattr(self, name) if not 0 <= i < self.depth]
            if bad:
                raise ValueError(f"{name} {bad} lie outside the {self.depth} blocks")
        block = self.patch_size * self.spatial_merge_size
        windowed = self.family == "qwen2_5_vl" and len(set(self.fullatt_block_indexes)) < self.depth
        if windowed and (self.window_size < block or self.window_size % block):
            raise ValueError(f"window_size {self.window_size} is not a positive multiple of patch_size * "
                             f"spatial_merge_size ({block}), and some blocks attend in windows")
        if self.family == "qwen3_vl" and round(self.num_position_embeddings ** 0.5) ** 2 != \
                self.num_position_embeddings:
            raise ValueError(f"num_position_embeddings {self.num_position_embeddings} is not a square grid")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Numbers in one flattened patch: channels x frames x pixels."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @classmethod
    def from_hf(cls, family: str, vision_config) -> "VisionSettings":
        """From a Hugging Face ``vision_config`` (dict or config object) of ``family``."""
        get = vision_config.get if isinstance(vision_config, dict) else \
            (lambda key, default=None: getattr(vision_config, key, default))
        rope = get("rope_parameters") or {}
        known = dict(depth=get("depth"), hidden_size=get("hidden_size"), num_heads=get("num_heads"),
                     intermediate_size=get("intermediate_size"), out_hidden_size=get("out_hidden_size"),
                     hidden_act=get("hidden_act"), patch_size=get("patch_size"),
                     temporal_patch_size=get("temporal_patch_size"), spatial_merge_size=get("spatial_merge_size"),
                     in_channels=get("in_channels"), rope_theta=rope.get("rope_theta"),
                     window_size=get("window_size"), fullatt_block_indexes=get("fullatt_block_indexes"),
                     num_position_embeddings=get("num_position_embeddings"),
                     deepstack_visual_indexes=get("deepstack_visual_indexes"))
        missing = [k for k in ("depth", "hidden_size", "num_heads", "intermediate_size", "out_hidden_size")
                   if known[k] is None]
        if missing:
            raise ValueError(f"the vision_config lacks {', '.join(missing)}")
        given = {k: (tuple(v) if isinstance(v, list) else v) for k, v in known.items() if v is not None}
        return cls(family=family, **given)
