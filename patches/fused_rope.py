"""STUB, being written: see issue 4. Replace this docstring with the upstream code changed and why."""
from __future__ import annotations

from adaptor.features import Feature


class FusedRope(Feature):
    name = "fused_rotary_pos_emb"

    def enabled(self, ctx) -> bool:
        return False  # not implemented yet
