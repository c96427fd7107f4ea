"""Fixtures the e2e tests share across files.

``shared_runs``: pretrain_gpt.py runs that tests in several files compare against (the tiny Qwen3
trained from its seed on mock data, 5 or 10 iterations, one process or TP=2), each run once per
session. Every test under tests/e2e is marked ``e2e`` by tests/conftest.py.
"""
from __future__ import annotations

import pytest

from helpers.megatron_runs import SHARED_RUNS, SharedRuns


@pytest.fixture(scope="session")
def shared_runs() -> SharedRuns:
    return SHARED_RUNS
