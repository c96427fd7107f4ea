"""An asynchronous torch_dist save stages host tensors as copies, so training on cannot change what
is written.

A fresh rank (gloo, one process) gives Megatron's ``FileSystemWriterAsync`` a bucket holding a live
host tensor, takes the staging function the async caller would run, stages, then changes the live
tensor in place as the next optimizer step does. The staged tensor must keep the old values. The same
is checked against upstream's own ``preload_tensors``, which hands back the live tensor: the fault
this patch fixes, and the sign that it is still needed.
"""
from __future__ import annotations

from helpers.processes import run_child, tagged_json
from helpers.warm_launcher import base_env

CHILD = """
import json, os, tempfile
import torch
import adaptor
from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

store = torch.distributed.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
writer = FileSystemWriterAsync(tempfile.mkdtemp(), thread_count=1)
live = torch.arange(6, dtype=torch.float32)
writer.write_buckets = [("/unused/__0_0.distcp", "__0_0.distcp", ([], [("exp_avg", live)]))]
save_fn, stage, args = writer.get_save_function_and_args()

def staged_after_a_step(staging):
    staged = staging()[0][2][1][0][1]
    before = live.tolist()
    live.add_(100.0)  # the trainer's next step, while the writer writes
    return {"before": before, "staged": staged.tolist()}

print("FACTS" + json.dumps({
    "patched": staged_after_a_step(stage),
    "upstream": staged_after_a_step(lambda: FileSystemWriterAsync.preload_tensors(writer.write_buckets, False)),
    "save_fn_unchanged": save_fn.func is FileSystemWriterAsync.write_preloaded_data_multithread,
}))
"""


def test_staged_host_tensors_do_not_follow_the_live_ones():
    out = run_child(CHILD, env=base_env({"ADAPTOR_QUIET": "1"}), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = tagged_json(out.stdout)
    patched, upstream = facts["patched"], facts["upstream"]
    assert patched["staged"] == patched["before"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], facts
    assert upstream["staged"] == [x + 100.0 for x in upstream["before"]], facts
    assert facts["save_fn_unchanged"], facts
