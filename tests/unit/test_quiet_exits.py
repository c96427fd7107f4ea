"""A save-side safety check that cannot run says so, and a save whose fsync fails fails."""
from __future__ import annotations

import os
import sys

import pytest


def megatron_args(monkeypatch, tmp_path, *extra):
    """Megatron's own parser over a tiny MoE command line, with what validate_args and the tokenizer fill in."""
    from megatron.training.arguments import parse_args

    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "64",
                                      "--num-attention-heads", "4", "--ffn-hidden-size", "128",
                                      "--num-experts", "4", "--moe-ffn-hidden-size", "32", "--save", str(tmp_path),
                                      "--save-interval", "1", *extra])
    args = parse_args()
    args.kv_channels, args.num_query_groups, args.padded_vocab_size = 16, 4, 128
    args.world_size = args.data_parallel_size = 1
    return args


def test_a_free_space_estimate_that_fails_says_the_check_did_not_run(monkeypatch, tmp_path, capsys):
    """--moe-layer-freq names three layers of a two-layer model: megatron-core's estimator asserts on it."""
    from patches.preflight.output_dirs import check_save_space

    monkeypatch.setenv("RANK", "0")
    check_save_space(megatron_args(monkeypatch, tmp_path, "--moe-layer-freq", "[1,1,1]"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "free-space check" in line]
    assert lines == ["[megatron-adaptor] warning: the free-space check of --save did not run: megatron-core's "
                     "parameter estimator failed on these arguments (AssertionError: Invalid length of "
                     "moe_layer_pattern: 3, expected 2, current moe layer pattern: [1, 1, 1])"], lines


def test_a_free_space_estimate_that_works_checks_quietly(monkeypatch, tmp_path, capsys):
    from patches.preflight.output_dirs import check_save_space

    check_save_space(megatron_args(monkeypatch, tmp_path, "--moe-layer-freq", "[1,1]"))
    assert "free-space check" not in capsys.readouterr().out


def test_a_failed_directory_fsync_fails(tmp_path):
    """A FIFO opens like a directory entry but rejects fsync (EINVAL): a real object whose fsync fails."""
    from adaptor.checkpoint import files
    from adaptor.checkpoint.errors import CheckpointError

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a FIFO with a writer opens for reading without blocking
    try:
        with pytest.raises(CheckpointError, match=r"cannot make .*fifo durable: fsync failed \(Invalid argument\)"):
            files.fsync_dir(fifo)
    finally:
        os.close(writer)


def test_a_save_whose_fsync_fails_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """The staging directory's fsync fails (EIO, as a failing disk returns it): the new iteration is not
    committed, and the tracker and the previous iteration are as they were."""
    import errno
    import stat

    from adaptor.checkpoint import files
    from adaptor.checkpoint.errors import CheckpointError

    previous = tmp_path / "iter_0000001"
    previous.mkdir()
    (previous / "rank_00000.safetensors").write_bytes(b"old")
    (tmp_path / files.TRACKER).write_text("1")
    new = tmp_path / "iter_0000002"
    staging = files.staging_dir(new)
    staging.mkdir()
    (staging / "rank_00000.safetensors").write_bytes(b"new")
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CheckpointError, match="fsync failed"):
        files.commit(new)
    assert not new.exists()
    assert (tmp_path / files.TRACKER).read_text() == "1"
    assert (previous / "rank_00000.safetensors").read_bytes() == b"old"


def test_the_dataset_writer_fails_on_a_failed_directory_fsync(tmp_path):
    """tools/indexed_writer.py's torch-free twin of fsync_dir, on the same FIFO."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
    try:
        import indexed_writer
    finally:
        sys.path.pop(0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)
    try:
        with pytest.raises(OSError, match=r"cannot make .*fifo durable: fsync failed \(Invalid argument\)"):
            indexed_writer._fsync_dir(str(fifo))
    finally:
        os.close(writer)
