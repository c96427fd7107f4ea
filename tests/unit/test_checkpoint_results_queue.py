"""The first torch_dist save starts its results queue's manager by fork, so it does not import the
training script again (7 to 14 s on a 2-core CPU before the patch).

A fresh rank imports the adaptor, asks Megatron's writer for its results queue as
``FileSystemWriterAsync.prepare_write_data`` does (no mode), passes an object through it, and reports
the kind of process serving it.
"""
from __future__ import annotations

from helpers.processes import run_child, tagged_json
from helpers.warm_launcher import base_env

CHILD = """
import json
import multiprocessing
import adaptor
from megatron.core.dist_checkpointing.strategies import filesystem_async

queue = filesystem_async.get_write_results_queue()
queue.put({"rank": 0})
print("FACTS" + json.dumps({"got": queue.get(timeout=30),
                            "kinds": sorted(type(p).__name__ for p in multiprocessing.active_children())}))
"""


def test_results_queue_is_served_by_a_forked_manager():
    out = run_child(CHILD, env=base_env({"ADAPTOR_QUIET": "1"}), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = tagged_json(out.stdout)
    assert facts == {"got": {"rank": 0}, "kinds": ["ForkProcess"]}, facts
