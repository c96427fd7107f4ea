"""adaptor.safe_load: torch.load with weights_only=True and the allow-list of what Megatron stores.

The reference is what Megatron itself puts into a ``--ckpt-format torch`` file: its argument
namespace (torch dtypes, its enums), Python/numpy/torch RNG states and the rerun state machine's
state, built here by megatron-core's own functions. End-to-end loads of Megatron's checkpoints:
tests/e2e/test_safe_torch_load.py.
"""
from __future__ import annotations

import argparse
import builtins
import os
import pathlib
import random

import numpy as np
import pytest
import torch

from adaptor.safe_load import RefusedPickle, torch_load


class _RunsShell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _RunsPython:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",)


def megatron_like_state() -> dict:
    from megatron.core.enums import ModelType
    from megatron.core.rerun_state_machine import Call, Caller, RerunDiagnostic, RerunMode, RerunState
    from megatron.core.transformer.enums import AttnBackend

    args = argparse.Namespace(params_dtype=torch.bfloat16, attention_backend=AttnBackend.auto,
                              model_type=ModelType.encoder_or_decoder, save=pathlib.PosixPath("/ckpt"),
                              num_layers=4, lr=1e-3, data_path=["a", "b"])
    rng = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
           "torch_rng_state": torch.get_rng_state(),
           "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()}}
    return {"args": args, "checkpoint_version": 3.0, "iteration": 7, "model": {"w": torch.arange(6.0).view(2, 3),
            "linear._extra_state": None}, "rng_state": [rng],
            # the types RerunStateMachine.state_dict() stores (it needs a process group to run); the
            # failed validation call is set in a checkpoint saved to rerun an iteration elsewhere
            "rerun_state_machine": {"mode": list(RerunMode)[0], "state": list(RerunState)[0],
                                    "diagnostic": list(RerunDiagnostic)[0], "rerun_requested": False,
                                    "failed_validation_call": Call(Caller("loss is NaN", 1), 3)},
            "num_floating_point_operations_so_far": 12.5}


def test_megatrons_own_types_load_even_with_torch_force_no_weights_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    state = megatron_like_state()
    torch.save(state, tmp_path / "model_optim_rng.pt")
    loaded = torch_load(tmp_path / "model_optim_rng.pt", map_location="cpu")
    assert vars(loaded["args"]) == vars(state["args"])
    assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and loaded["model"]["linear._extra_state"] is None
    rng = loaded["rng_state"][0]
    assert rng["random_rng_state"] == state["rng_state"][0]["random_rng_state"]
    assert np.array_equal(rng["np_rng_state"][1], state["rng_state"][0]["np_rng_state"][1])
    assert torch.equal(rng["torch_rng_state"], state["rng_state"][0]["torch_rng_state"])
    assert loaded["rerun_state_machine"] == state["rerun_state_machine"]
    assert type(loaded["rerun_state_machine"]["failed_validation_call"].caller).__name__ == "Caller"


@pytest.mark.parametrize("payload,refused", [(_RunsShell, "posix.system"), (_RunsPython, "exec")])
def test_a_pickle_that_runs_code_is_refused_and_does_not_run(tmp_path, monkeypatch, payload, refused):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # would make a plain torch.load unpickle it
    marker = tmp_path / "code_ran"
    torch.save({"model": {}, "args": payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(RefusedPickle) as err:
        torch_load(tmp_path / "evil.pt", map_location="cpu")
    assert str(err.value).startswith(f"{tmp_path / 'evil.pt'}: refused to unpickle {refused}: ")
    assert not marker.exists()


def test_a_class_outside_the_allow_list_is_refused(tmp_path):
    torch.save({"args": argparse.Action(["--x"], "x")}, tmp_path / "action.pt")
    with pytest.raises(RefusedPickle, match=r"refused to unpickle argparse.Action"):
        torch_load(tmp_path / "action.pt")
