"""The warm launcher is sound: a rank forked from the zygote starts as a fresh interpreter would.

Most runs of the suite start warm (helpers/warm_launcher.py, helpers/zygote.py). What each test here
shows, comparing the same command launched warm and cold (``torchrun``) side by side:

* a rank sees none of this repository's modules before its script runs, no other thread, no process
  group; its ``sys.argv``, ``__name__``, ``sys.path[0]``, working directory and environment are the cold
  rank's (torchrun's variables included), apart from the port and torchrun's error file;
* each rank draws its own seeds, as fresh interpreters do (Python's, numpy's and torch's generators
  differ between ranks and between runs);
* exit statuses: a rank that fails first is reported as torchrun reports it (rank, exit code), the
  others are stopped, and the launch fails; a rank ends as Python's shutdown ends a process (threads
  joined, atexit callbacks run, streams flushed, the exit status and last stderr line of each way a
  script can end);
* a training run gives the cold run's loss curve bit for bit (TP=2);
* a run whose environment changes what the zygote imported (here ``PYTHONPATH``) is served by a
  zygote started with that environment.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.megatron_runs import TINY_QWEN3, launch, tail
from helpers.paths import STANDIN

PROBE = """
import json, os, random, sys, threading
threads_at_start = len(os.listdir("/proc/self/task"))
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("adaptor", "patches", "pretrain_gpt", "helpers"))
import numpy as np
import torch
facts = {
    "ours": ours, "threads_at_start": threads_at_start, "threading": threading.active_count(),
    "argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
    "dist": torch.distributed.is_initialized(), "seed": torch.initial_seed(), "random": random.random(),
    "numpy": float(np.random.random()), "env": dict(os.environ),
    "torch_npu_on_path": __import__("importlib.util").util.find_spec("torch_npu") is not None,
}
# Each rank's facts go to a file of their own; stdout carries only its name, in one short write, so that
# two ranks sharing the launcher's pipe cannot interleave inside it.
path = os.path.abspath("facts-%d.json" % os.getpid())
with open(path, "w") as f:
    json.dump(facts, f)
os.write(1, ("FACTS " + path + "\\n").encode())
code = int(os.environ.get("EXIT_RANK_" + os.environ.get("RANK", "0"), "0"))
if code:
    sys.exit(code)
if os.environ.get("EXIT_RANK_1") and os.environ.get("RANK") == "0":
    import time
    time.sleep(60)  # stopped by the launcher once rank 1 has failed
"""
VOLATILE = {"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "TORCHINDUCTOR_CACHE_DIR"}


def facts(run) -> list[dict]:
    found = [json.loads(Path(name).read_text()) for name in re.findall(r"FACTS (\S+\.json)", run.stdout)]
    return sorted(found, key=lambda f: f["env"]["RANK"])


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "probe.py"
    path.write_text(PROBE)
    return path


def test_a_warm_rank_starts_as_a_cold_one(probe):
    warm = launch(probe, ["--flag", "value"], nproc=2, cwd=probe.parent)
    cold = launch(probe, ["--flag", "value"], nproc=2, cwd=probe.parent, warm=False)
    assert warm.warm and not cold.warm and warm.returncode == cold.returncode == 0, warm.output + cold.output
    warm_facts, cold_facts = facts(warm), facts(cold)
    assert len(warm_facts) == len(cold_facts) == 2
    for w, c in zip(warm_facts, cold_facts):
        assert w["ours"] == c["ours"] == []
        assert w["threads_at_start"] == c["threads_at_start"] == 1 and w["threading"] == 1
        for key in ("argv", "cwd", "name", "path0", "dist", "torch_npu_on_path"):
            assert w[key] == c[key], key
        env_w = {k: v for k, v in w["env"].items() if k not in VOLATILE}
        env_c = {k: v for k, v in c["env"].items() if k not in VOLATILE}
        assert env_w == env_c
    for key in ("seed", "random", "numpy"):  # each rank, and each run, draws its own
        assert warm_facts[0][key] != warm_facts[1][key], key
        assert {f[key] for f in warm_facts}.isdisjoint(f[key] for f in cold_facts), key
    assert warm.threads_at_fork == 1


def test_the_first_failure_is_reported_and_ends_the_run(probe):
    for warm in (True, False):
        run = launch(probe, [], nproc=2, env={"EXIT_RANK_1": "3"}, cwd=probe.parent, warm=warm, timeout=120)
        assert run.returncode == 1 and run.first_failure == (1, 3), (warm, run.first_failure, tail(run.output))
        assert run.wall_s < 50  # rank 0 was stopped, not left to sleep its 60 s
    python = launch(probe, [], env={"EXIT_RANK_0": "4"}, cwd=probe.parent, launcher="python")
    assert python.warm and python.returncode == 4 and python.exitcodes == [4]


ENDINGS = {  # how a script ends -> what Python's shutdown must do with it
    "returns": "pass",
    "sys.exit(7)": "sys.exit(7)",
    "sys.exit('message')": "sys.exit('a message for stderr')",
    "an uncaught exception": "raise RuntimeError('uncaught')",
}
ENDING = """
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
def late():
    time.sleep(0.5)
    print("non-daemon thread finished", flush=True)
threading.Thread(target=late).start()
sys.stdout.write("buffered, never flushed by the script")
"""


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_rank_ends_as_pythons_shutdown_ends_it(ending):
    """The warm rank skips the module teardown only: threads are joined, atexit callbacks run, streams
    are flushed, the exit status and what reaches stderr are the cold process's."""
    code = ENDING + ENDINGS[ending] + "\n"
    warm, cold = (launch("-c", [], launcher="python", code=code, warm=w) for w in (True, False))
    assert warm.warm and not cold.warm
    assert warm.returncode == cold.returncode, (warm.returncode, cold.returncode)
    assert sorted(warm.stdout.splitlines()) == sorted(cold.stdout.splitlines()), (warm.stdout, cold.stdout)
    assert "atexit ran" in warm.stdout and "non-daemon thread finished" in warm.stdout
    last = lambda run: (run.stderr.strip().splitlines() or [""])[-1]  # noqa: E731
    assert last(warm) == last(cold), (warm.stderr[-1000:], cold.stderr[-1000:])


def test_a_warm_training_run_equals_the_cold_one():
    args = TINY_QWEN3 + ["--train-iters", "3", "--tensor-model-parallel-size", "2"]
    warm, cold = launch("pretrain_gpt.py", args, nproc=2), launch("pretrain_gpt.py", args, nproc=2, warm=False)
    assert warm.warm and warm.returncode == 0 and cold.returncode == 0, tail(warm.output + cold.output)
    assert warm.curve() == cold.curve() and len(warm.curve()) == 3


def test_import_time_variables_get_their_own_zygote(probe):
    run = launch(probe, [], env={"PYTHONPATH": str(STANDIN)}, cwd=probe.parent)
    assert run.warm and run.returncode == 0, run.output
    assert facts(run)[0]["torch_npu_on_path"] and facts(run)[0]["env"]["PYTHONPATH"] == str(STANDIN)
