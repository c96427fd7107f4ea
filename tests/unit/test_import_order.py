"""``import adaptor`` works whether megatron was imported before it or after.

Each import order runs in a fresh interpreter (``sys.executable -c``) with
``ADAPTOR_BACKEND=cpu``. The child prints one ``FACTS {...}`` JSON line and
the parent asserts on it, so every order costs a single megatron import.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from helpers import processes
from helpers.megatron_runs import side_by_side
from helpers.prefetch import prefetched
TARGET = "megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32"

# Shared tail of both child scripts: collect facts, tear down, collect again.
# Expects the caller to fill ORIG["clip"] and ORIG["current_device"]. They live in a
# dict, not in globals: alias rebinding would (rightly) repoint a global of __main__.
FACTS = """
import json, sys
import torch
import megatron.core.optimizer.clip_grads as clip_grads
import megatron.core.optimizer.optimizer as optimizer
import patches.device.device_agnostic_clip_grads

patched = patches.device.device_agnostic_clip_grads.clip_grad_by_total_norm_fp32
orig_clip, orig_current_device = ORIG["clip"], ORIG["current_device"]
facts = {
    "orig_clip_module": orig_clip.__module__,
    "orig_current_device_module": orig_current_device.__module__,
    "clip_module_patched": clip_grads.clip_grad_by_total_norm_fp32 is patched,
    "clip_alias_patched": optimizer.clip_grad_by_total_norm_fp32 is patched,
    "current_device": torch.cuda.current_device(),
    "backend": run_state.backend().name,
}
bootstrap.teardown()
facts.update({
    "after_clip_module_is_orig": clip_grads.clip_grad_by_total_norm_fp32 is orig_clip,
    "after_clip_alias_is_orig": optimizer.clip_grad_by_total_norm_fp32 is orig_clip,
    "after_current_device_is_orig": torch.cuda.current_device is orig_current_device,
    "after_replacement_home": patches.device.device_agnostic_clip_grads.clip_grad_by_total_norm_fp32.__module__,
})
print("FACTS " + json.dumps(facts), flush=True)
"""

ADAPTOR_FIRST = """
import adaptor
from adaptor import bootstrap, run_state
import adaptor  # a second import and setup() call must not print again
from adaptor import bootstrap, run_state
bootstrap.setup()
from megatron.core.optimizer import optimizer
import megatron.training.training
ORIG = {
    "clip": bootstrap.patch_manager.original("%s"),
    "current_device": bootstrap.patch_manager.original("torch.cuda.current_device"),
}
""" % TARGET + FACTS

MEGATRON_FIRST = """
import megatron.training.training
import megatron.core.optimizer.optimizer
import torch
import megatron.core.optimizer.clip_grads
ORIG = {
    "clip": megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32,
    "current_device": torch.cuda.current_device,
}
import adaptor
from adaptor import bootstrap, run_state
""" + FACTS


def run_child(code: str, backend: str = "cpu") -> subprocess.CompletedProcess:
    """A fresh interpreter (import order is what is tested: never a warm one); rank 0 prints."""
    env = dict(os.environ, ADAPTOR_BACKEND=backend)
    env.pop("RANK", None)  # the summary and errors are printed on rank 0 only
    return processes.run_child(textwrap.dedent(code), env=env, timeout=120, warm=False)


def facts_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("FACTS ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0][len("FACTS "):])


@prefetched
def children():
    """Both import orders, each in a fresh interpreter, side by side."""
    orders = {"adaptor_first": ADAPTOR_FIRST, "megatron_first": MEGATRON_FIRST}
    return dict(zip(orders, side_by_side(*[(lambda code=code: run_child(code)) for code in orders.values()])))


@pytest.fixture(params=["adaptor_first", "megatron_first"])
def child(request, children):
    proc = children[request.param]
    return proc, facts_of(proc)


def test_clip_grads_patched_in_module_and_from_import_alias(child):
    """clip_grads.clip_grad_by_total_norm_fp32 and optimizer.py's `from .clip_grads import`
    copy are both the adaptor's function, in either import order."""
    _, facts = child
    assert facts["orig_clip_module"] == "megatron.core.optimizer.clip_grads"
    assert facts["clip_module_patched"] is True
    assert facts["clip_alias_patched"] is True


def test_cpu_backend_redirects_current_device(child):
    """On the cpu backend torch.cuda.current_device() answers 0 instead of touching CUDA."""
    _, facts = child
    assert facts["backend"] == "cpu"
    assert facts["current_device"] == 0


def test_summary_printed_once_and_names_backend(child):
    """The start-up summary is printed once on stdout and names backend=cpu."""
    proc, _ = child
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[megatron-adaptor]")]
    headers = [line for line in lines if "backend=" in line]
    assert len(headers) == 1, proc.stdout
    assert "backend=cpu" in headers[0]
    assert sum(line.startswith("[megatron-adaptor] features:") for line in lines) == 1
    assert TARGET in "\n".join(lines)
    assert "[megatron-adaptor]" not in proc.stderr


def test_teardown_restores_originals(child):
    """bootstrap.teardown() puts back torch.cuda.current_device and megatron's clip function,
    in the defining module and in the optimizer.py alias."""
    _, facts = child
    assert facts["orig_current_device_module"] == "torch.cuda"
    assert facts["after_current_device_is_orig"] is True
    assert facts["after_clip_module_is_orig"] is True
    assert facts["after_clip_alias_is_orig"] is True
    # ... while the adaptor's own function stays where it is defined.
    assert facts["after_replacement_home"] == "patches.device.device_agnostic_clip_grads"


def test_optimizer_alias_exists_upstream():
    """Guard for the alias test: optimizer.py really does `from .clip_grads import ...`."""
    spec = importlib.util.find_spec("megatron")  # locates the package without importing megatron.core
    sources = [Path(p) / "core" / "optimizer" / "optimizer.py" for p in spec.submodule_search_locations]
    source = next(p for p in sources if p.exists()).read_text()
    assert "from .clip_grads import clip_grad_by_total_norm_fp32" in source


def test_unknown_backend_is_a_one_line_error():
    """ADAPTOR_BACKEND=bogus exits non-zero with one 'megatron-adaptor: error:' line
    naming the valid backends, and no traceback."""
    proc = run_child("import adaptor", backend="bogus")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("megatron-adaptor: error:")
    for name in ("npu", "cuda", "cpu"):
        assert name in lines[0]
    assert "bogus" in lines[0]
    assert "[megatron-adaptor]" not in proc.stdout
