"""pretrain_gpt.py whose checkpoint commit waits first, so a test can kill the run in the middle of a save.

Only our own code is slowed (``adaptor.checkpoint.files.commit``: rank 0's step that makes a saved
checkpoint visible); Megatron and torch run unchanged. ``STALL_AT_ITERATION`` names the save to stall.
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
_stall = f"iter_{int(os.environ['STALL_AT_ITERATION']):07d}"


def stalled_commit(checkpoint_dir):
    if Path(checkpoint_dir).name == _stall:
        print(f"STALLED {checkpoint_dir}", flush=True)
        time.sleep(600)
    return _commit(checkpoint_dir)


files.commit = stalled_commit
runpy.run_path(sys.argv[0], run_name="__main__")
