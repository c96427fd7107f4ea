"""A torch-format checkpoint loads only at the tensor-parallel size it was saved at: the size is read from
its ``mp_rank_TT[_PPP][_EEE]`` directories, so a load at another size gets that line rather than the
per-rank shape mismatch torch reports."""
from __future__ import annotations

import pytest

from patches.checkpoint.load_shape_check import _torch_checkpoint_tp


@pytest.mark.parametrize("dirs,expected", [
    (["mp_rank_00"], 1),
    (["mp_rank_00", "mp_rank_01"], 2),
    (["mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"], 2),  # TP2 x PP2
    (["mp_rank_00_000_000", "mp_rank_00_000_001"], 1),  # expert-parallel ranks of TP1
    (["__0_0.distcp", "common.pt"], None),  # torch_dist: no mp_rank dirs
])
def test_saved_tensor_parallel_size(tmp_path, dirs, expected):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    for name in dirs:
        (tmp_path / "iter_0000003" / name).mkdir(parents=True)
    assert _torch_checkpoint_tp(tmp_path) == expected


def test_no_tracker_is_unknown(tmp_path):
    assert _torch_checkpoint_tp(tmp_path) is None
