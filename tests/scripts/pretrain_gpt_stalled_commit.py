"""pretrain_gpt.py whose checkpoint commit waits at one point, so a test can kill the run in the middle of a save.

Only our own code is slowed (``adaptor.checkpoint.files.commit``: rank 0's step that makes a saved
checkpoint visible); Megatron and torch run unchanged. ``STALL_AT_ITERATION`` names the save to stall;
``STALL_POINT`` where, printing ``STALLED <point> <checkpoint dir>`` first:

* ``staged`` (default): every rank's files are written and fsynced, no marker yet;
* ``marked``: the marker is written and fsynced, the staging directory not yet renamed;
* ``renamed``: the directory is in place, Megatron's tracker not yet updated.
"""
import os
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.argv[0] = str(ROOT / "pretrain_gpt.py")

import adaptor  # noqa: E402,F401
import adaptor.checkpoint.files as files  # noqa: E402

_commit = files.commit
_fsync_dir = files.fsync_dir
_stall = f"iter_{int(os.environ['STALL_AT_ITERATION']):07d}"
_point = os.environ.get("STALL_POINT", "staged")
assert _point in ("staged", "marked", "renamed"), _point


def stall(checkpoint_dir):
    print(f"STALLED {_point} {checkpoint_dir}", flush=True)
    time.sleep(600)


def stalled_commit(checkpoint_dir):
    final = Path(checkpoint_dir)
    if final.name != _stall:
        return _commit(checkpoint_dir)
    if _point == "staged":
        stall(checkpoint_dir)

    def fsync_dir(path):  # commit fsyncs the staging directory after the marker, the parent after the rename
        _fsync_dir(path)
        if (_point == "marked" and Path(path) == files.staging_dir(final)) or \
                (_point == "renamed" and Path(path) == final.parent):
            stall(checkpoint_dir)

    files.fsync_dir = fsync_dir
    try:
        return _commit(checkpoint_dir)
    finally:
        files.fsync_dir = _fsync_dir


files.commit = stalled_commit
runpy.run_path(sys.argv[0], run_name="__main__")
