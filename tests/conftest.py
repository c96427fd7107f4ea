"""Test tiers, the shared helpers' import path, and fixtures both tiers use.

* ``tests/unit``: in-process checks and single short child interpreters (ops, the patch manager, argument
  tables, tokenizers, small conversions, the torch_npu contract): ``pytest -q tests/unit``, a few minutes.
* ``tests/e2e``: real torchrun/gloo jobs, training runs, tools run on real files. Every test there is
  marked ``e2e`` here, so ``pytest -m "not e2e" tests`` is the unit tier.

Runs of the entry scripts start warm (helpers/warm_launcher.py: forked from one process that imported
torch and Megatron once); ``ADAPTOR_TEST_COLD=1 pytest ...`` starts every one cold, as its command line.

``tests/`` goes on sys.path so that tests and child scripts import ``helpers.<module>``. Slow e2e fixtures
declared ``@prefetched`` (helpers/prefetch.py) start on a background thread once collection ends.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from helpers.hf_fixtures import (  # noqa: E402
    make_tiny_deepseek_v3, make_tiny_llama, make_tiny_mixtral, make_tiny_qwen2_5_vl, make_tiny_qwen3, make_tiny_qwen3_moe,
    make_tiny_qwen3_vl,
)

E2E = TESTS / "e2e"


def pytest_collection_modifyitems(config, items):
    """Mark everything under tests/e2e, and run the unit tier first (it fails fast and cheaply). Every
    test of a module that runs the torch_npu stand-in proves a backend contract (marked so here)."""
    from helpers.npu_contract import standin_env

    for item in items:
        if E2E in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "standin_env", None) is standin_env:
            item.add_marker(pytest.mark.backend_contract)
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)  # stable: file order kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped ``backend_contract`` test is a failure: the proof that a backend's calls are ones it
    accepts must not vanish from a green run (a missing file, a module that cannot be imported)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("backend_contract"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"a backend contract test may not be skipped: {reason}"


def pytest_collection_finish(session):
    """Start the warm launcher's zygote, and the slow fixtures of the selected e2e tests, on the core
    the tests ahead of them leave idle."""
    from helpers.prefetch import start_for
    from helpers.warm_launcher import ZYGOTES, cold_only

    option = session.config.option
    if session.items and not option.collectonly and not cold_only():
        ZYGOTES.prestart()
    start_for(session)


def pytest_terminal_summary(terminalreporter):
    from helpers.prefetch import PREFETCH
    from helpers.warm_launcher import STARTS, STATS, user_path_summary

    if PREFETCH.futures:
        terminalreporter.write_line(PREFETCH.summary())
    if any(STATS.values()):
        terminalreporter.write_line("warm launcher: " + ", ".join(f"{v} {k}" for k, v in STATS.items()))
    for what, count in sorted(STARTS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"  zygote started {count}x for {what}")
    if any(STATS.values()):
        for line in user_path_summary():
            terminalreporter.write_line(line)


def pytest_sessionfinish(session):
    from helpers.prefetch import PREFETCH
    from helpers.warm_launcher import ZYGOTES

    PREFETCH.stop()
    ZYGOTES.stop()


# YaRN stretching a 16-position original context 4x: test_hf_parity.py's 32-token batch crosses it.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}

# Tiny random Hugging Face checkpoints (helpers/hf_fixtures.py) that tests in both tiers read. Each is
# written on first use and then shared; a test that edits one copies it first.
HF_MODELS = {
    "qwen3_tied": lambda path: make_tiny_qwen3(path, tied=True, shards=1),
    "qwen3_untied": lambda path: make_tiny_qwen3(path, tied=False, shards=2),
    "deepseek_v3": lambda path: make_tiny_deepseek_v3(path, mtp_layers=1, shards=2),
    "deepseek_v3_other": lambda path: make_tiny_deepseek_v3(path, mtp_layers=1, shards=2, seed=7),
    "qwen3_yarn": lambda path: make_tiny_qwen3(path, rope_scaling=YARN),
    "qwen3_yarn_factor": lambda path: make_tiny_qwen3(path, rope_scaling={
        **YARN, "attention_factor": 1.3, "beta_fast": 16.0, "beta_slow": 2.0}),
    "qwen3_linear": lambda path: make_tiny_qwen3(path, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    # Llama 3 (rope_type llama3) and Qwen2.5 (q/k/v bias): GQA 8 heads / 2 groups, head_dim 14.
    "llama_untied": lambda path: make_tiny_llama(path, tied=False, shards=2),
    "llama_tied": lambda path: make_tiny_llama(path, tied=True),
    "qwen2_tied": lambda path: make_tiny_llama(path, tied=True, family="qwen2"),
    "qwen2_untied": lambda path: make_tiny_llama(path, tied=False, shards=2, family="qwen2"),
    "qwen3_moe": lambda path: make_tiny_qwen3_moe(path),
    "mixtral": lambda path: make_tiny_mixtral(path),
    # The sample tokenizer's vocabulary (1,436 tokens): text decoders of pretrain_mm.py.
    "qwen3_vocab1436": lambda path: make_tiny_qwen3(path, vocab_size=1436),
    # Whole vision-language models (tied Qwen2.5-VL; untied Qwen3-VL with deepstack): pretrain_mm.py's Qwen-VL side.
    "qwen2_5_vl": lambda path: make_tiny_qwen2_5_vl(path),
    "qwen3_vl": lambda path: make_tiny_qwen3_vl(path),
}


class HfModels:
    """``tiny_hf[name]``: the directory of one of HF_MODELS, written the first time it is asked for."""

    def __init__(self, root: Path):
        self.root = root
        self.made: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.made:
            self.made[name] = HF_MODELS[name](self.root / name)
        return self.made[name]


@pytest.fixture(autouse=True)
def _adaptor_variables_unchanged():
    """Every launch copies this process's environment: a test that leaves an ``ADAPTOR_*`` variable set (a
    tool's main() run in-process sets ADAPTOR_QUIET, as its own process would) changes every later run's
    output. Such a test fails here, at its own teardown, instead of the runs after it."""
    before = {k: v for k, v in os.environ.items() if k.startswith("ADAPTOR_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("ADAPTOR_")}
    assert after == before, f"the test left ADAPTOR_* variables changed: {before} -> {after}"


@pytest.fixture(autouse=True)
def _import_time_variables_restored():
    """In-process code sets variables that child processes read at import: Megatron's argument
    validation sets ``CUDA_DEVICE_MAX_CONNECTIONS`` and ``NVTE_*``, some libraries set their own. Every
    launch copies this environment, so one test's leftovers changed the environment of later runs, and
    the warm launcher, which keeps a zygote per set of such variables, started one per combination (9
    zygotes for 4 sets in the unit tier). They are put back after each test."""
    from helpers.zygote import import_time_variables

    before = import_time_variables(os.environ)
    yield
    after = import_time_variables(os.environ)
    for name in after.keys() - before.keys():
        os.environ.pop(name, None)
    for name, value in before.items():
        if after.get(name) != value:
            os.environ[name] = value


@pytest.fixture(scope="session")
def cpu_training_process():
    """This pytest process set up as a training run sets itself up (``import adaptor`` in an entry
    file): for tests that build Megatron modules in-process, which need the device patches.
    Importing our modules alone sets nothing up, so a test asks for this explicitly."""
    from adaptor.bootstrap import setup

    return setup(argv=[], quiet=True)


@pytest.fixture(scope="module")
def model_parallel(cpu_training_process):
    """One gloo process with Megatron's model-parallel groups (all of size 1), for tests that build
    Megatron modules in-process."""
    import torch
    from megatron.core import parallel_state as ps

    made_group = not torch.distributed.is_initialized()
    if made_group:
        torch.distributed.init_process_group("gloo", rank=0, world_size=1, store=torch.distributed.HashStore())
    made_parallel = not ps.model_parallel_is_initialized()
    if made_parallel:
        ps.initialize_model_parallel()
    yield
    # Undone after the module, so that tests elsewhere that make their own group find none.
    if made_parallel:
        ps.destroy_model_parallel()
    if made_group:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory) -> HfModels:
    return HfModels(tmp_path_factory.mktemp("tiny_hf"))


@pytest.fixture(scope="session")
def hf_models(tiny_hf) -> dict[str, Path]:
    """The checkpoints test_convert_ckpt.py (both tiers) converts, by its model-type keys."""
    return {"qwen3_tied": tiny_hf["qwen3_tied"], "qwen3_untied": tiny_hf["qwen3_untied"],
            "deepseek3": tiny_hf["deepseek_v3"], **{key: tiny_hf[key] for key in (
                "llama_untied", "llama_tied", "qwen2_tied", "qwen2_untied")}}


@pytest.fixture(scope="session")
def hf_dirs(tiny_hf) -> HfModels:
    """test_hf_parity.py's checkpoints (both tiers), by name: every entry of HF_MODELS."""
    return tiny_hf
