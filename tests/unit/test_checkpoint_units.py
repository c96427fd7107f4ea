"""In-process pieces of the safetensors checkpoint: the pickle-free codec, retention, shard assembly."""
from __future__ import annotations

import argparse
import io
import json
import random

import numpy as np
import pytest
import torch

from adaptor.checkpoint import files
from adaptor.checkpoint.object_codec import EncodeError, Encoder, decode
from adaptor.checkpoint.retention import prune


def round_trip(obj):
    encoder = Encoder("t.")
    text = json.dumps(encoder.encode(obj), allow_nan=False)  # strict JSON: no NaN/Infinity literals
    return decode(json.loads(text), lambda name: encoder.tensors[name])


def test_codec_round_trips_what_megatron_checkpoints_hold():
    from megatron.core.rerun_state_machine import RerunDiagnostic, RerunState

    random.seed(3)
    np.random.seed(3)
    state = {
        "random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
        "args": argparse.Namespace(lr=1e-3, params_dtype=torch.bfloat16, betas=(0.9, 0.95), layers=[0, 1]),
        "enums": [RerunState.NOT_RUNNING_YET, RerunDiagnostic.TRANSIENT_ERROR],
        "floats": [float("inf"), float("-inf")], "int_keys": {0: "a", 3: {"step": torch.tensor(4.0)}},
        "bytes": b"\x00\x01", "io": io.BytesIO(b"abc"), "none": None, "set": {2, 1},
    }
    back = round_trip(state)
    random.setstate(back["random"])
    np.random.set_state(back["numpy"])
    assert random.random() == (random.seed(3) or random.random())
    assert np.random.rand() == (np.random.seed(3) or np.random.rand())
    assert torch.equal(back["torch"], state["torch"]) and back["args"] == state["args"]
    assert back["enums"] == state["enums"] and type(back["enums"][1]) is RerunDiagnostic
    assert back["floats"] == state["floats"] and back["int_keys"][3]["step"] == 4.0
    assert back["bytes"] == b"\x00\x01" and back["io"].getvalue() == b"abc" and back["set"] == {1, 2}
    assert back["none"] is None and isinstance(back["args"].betas, tuple)


def test_codec_refuses_what_it_cannot_store_without_pickle():
    with pytest.raises(EncodeError, match=r"optimizer\.hook: a builtins.builtin_function_or_method cannot be stored without pickle"):
        Encoder("t.").encode({"optimizer": {"hook": len}})
    # An enum of a module the loader has not imported stays its member's name: nothing is imported.
    assert decode({"__enum__": "some_module_never_imported.Kind", "name": "A"}, None) == "A"


def fake_checkpoint(save, iteration):
    path = save / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    (path / files.MARKER).write_text(json.dumps({"sharded_backend": files.BACKEND}))
    return path


def test_retention_keeps_the_newest_and_the_retained(tmp_path):
    for it in (100, 200, 300, 400, 500):
        fake_checkpoint(tmp_path, it)
    (tmp_path / "iter_0000600").mkdir()  # no marker: a save still being written is never counted or deleted
    (tmp_path / ".iter_0000300.partial").mkdir()  # a killed save, older than the newest checkpoint
    # 200 and 400 are kept by --save-retain-interval 200 and do not count; of 100, 300, 500 the newest two stay.
    deleted = prune(tmp_path, keep_max=2, retain_interval=200, log=lambda _: None)
    assert deleted == [100]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000200", "iter_0000300", "iter_0000400",
                                                           "iter_0000500", "iter_0000600"]
    assert prune(tmp_path, keep_max=1, log=lambda _: None) == [200, 300, 400]


def test_flat_pieces_of_another_chunk_are_reassembled(tmp_path):
    """A distributed-optimizer layout saved at TP=2 (flat ranges of each half) read as one whole tensor."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from adaptor.checkpoint.reader import CheckpointIndex
    from adaptor.safetensors_file import write_file

    full = torch.arange(48, dtype=torch.float32).reshape(8, 6)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    names = []
    for rank, (rows, flat) in enumerate([((0, 4), (0, 10)), ((0, 4), (10, 24)), ((4, 8), (0, 17)), ((4, 8), (17, 24))]):
        chunk = full[rows[0]:rows[1]].reshape(-1)[flat[0]:flat[1]]
        table = [{"name": "w", "key": "w", "dtype": "float32", "global_shape": [8, 6], "global_offset": [rows[0], 0],
                  "local_shape": [4, 6], "prepend_axis_num": 0, "flattened_range": list(flat)}]
        write_file(ckpt / files.rank_file(rank), [("w", chunk.clone())],
                   {"format": files.FORMAT_NAME, "shards": json.dumps(table), "objects": "{}"})
        names.append(files.rank_file(rank))
    (ckpt / files.COMMON_JSON).write_text(json.dumps({"format": files.FORMAT_NAME, "files": names, "state": {}}))
    index = CheckpointIndex(ckpt)
    whole = index.load_tensor(ShardedTensor("w", None, torch.float32, (8, 6), (8, 6), (0, 0), None))
    assert torch.equal(whole, full)
    rows_2_to_6 = ShardedTensor("w", None, torch.float32, (4, 6), (8, 6), (2, 0), None)
    assert torch.equal(index.load_tensor(rows_2_to_6), full[2:6])


def test_megatrons_tracker_write_replaces_the_file_and_never_empties_it(tmp_path, cpu_training_process):
    """save_checkpoint's ``with maybe_msc.open(tracker, 'w') as f: f.write(...)``, as Megatron runs it:
    until the block ends the old tracker is intact (a kill there keeps it), a failing block keeps it,
    and other files open as plain files."""
    from megatron.training import checkpointing

    tracker = tmp_path / files.TRACKER
    tracker.write_text("3")
    with checkpointing.maybe_msc.open(str(tracker), "w") as f:
        f.write("6")
        assert tracker.read_text() == "3"
    assert tracker.read_text() == "6"
    with pytest.raises(RuntimeError):
        with checkpointing.maybe_msc.open(str(tracker), "w") as f:
            f.write("9")
            raise RuntimeError("killed")
    assert tracker.read_text() == "6" and sorted(p.name for p in tmp_path.iterdir()) == [files.TRACKER]
    other = tmp_path / "progress.txt"
    with checkpointing.maybe_msc.open(str(other), "w") as f:
        f.write("x")
        assert isinstance(f, io.TextIOWrapper)
    assert other.read_text() == "x" and checkpointing.maybe_msc.os.path.isfile(str(other))
