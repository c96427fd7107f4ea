"""pretrain_gpt.py whose ``--hf-save-dir`` export fails on purpose, so a test can see how a failure ends.

Only our own code is changed (``adaptor.convert``); Megatron and torch run unchanged. ``FAIL_AT``:

* ``rank1``: rank 1's hand-over of its model state raises (``write_rank_state``);
* ``writer``: rank 0's HF writer raises once it has written every shard, having printed
  ``HANDOVER`` and the files the ranks handed over (JSON list, relative to their directory) first.
"""
import json
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.argv[0] = str(ROOT / "pretrain_gpt.py")

import adaptor  # noqa: E402,F401
import adaptor.convert.hf_writer as hf_writer  # noqa: E402
import adaptor.convert.online as online  # noqa: E402

_write_rank_state, _write_hf_dir, _write_shards = online.write_rank_state, hf_writer.write_hf_dir, hf_writer.write_shards


def write_rank_state(model, args, directory, lora=None):
    import torch

    if torch.distributed.get_rank() == 1:
        raise OSError("No space left on device (injected)")
    return _write_rank_state(model, args, directory, lora)


def write_hf_dir(save_dir, source, *args, **kwargs):
    handed_over = sorted(str(p.relative_to(source.path)) for p in Path(source.path).rglob("*") if p.is_file())
    print("HANDOVER " + json.dumps(handed_over), flush=True)
    return _write_hf_dir(save_dir, source, *args, **kwargs)


def write_shards(*args, **kwargs):
    _write_shards(*args, **kwargs)
    raise OSError("No space left on device (injected)")


if os.environ["FAIL_AT"] == "rank1":
    online.write_rank_state = write_rank_state
else:
    hf_writer.write_hf_dir, hf_writer.write_shards = write_hf_dir, write_shards
runpy.run_path(sys.argv[0], run_name="__main__")
