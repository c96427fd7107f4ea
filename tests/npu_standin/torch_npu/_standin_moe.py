"""STAND-IN torch_npu fused operators (moe): check each call's arguments, return CPU reference results."""
from __future__ import annotations

__all__: list[str] = []
