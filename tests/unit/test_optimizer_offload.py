"""The host-offloading Adam (adaptor.memory.optimizer_offload) against torch's own AdamW.

On CPU tensors both run torch's single-tensor Adam kernel per parameter, so the offloaded and the
plain optimizer agree bit for bit; what the offload adds is where the state lives, which these tests
check by storage (the host copies are separate allocations, never views of the parameters).
"""
from __future__ import annotations

import argparse
import copy

import pytest
import torch

from adaptor.backend import Backend
from adaptor.features import ArgumentError, FeatureContext
from adaptor.memory.optimizer_offload import HostOffloadAdam, offloaded_prefix
from helpers.npu_contract import standin_env
from helpers.processes import run_child, tagged_json
from patches.memory.optimizer_offload import OptimizerOffload

SIZES = (10, 30, 5, 55)


def _twins(fraction):
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(n)) for n in SIZES]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]

    def groups(ps):
        return [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]

    plain = torch.optim.AdamW(groups(theirs), lr=1e-2)
    offload = HostOffloadAdam(groups(ours), lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                              decoupled_weight_decay=True, fraction=fraction, device_type="cpu")
    return ours, theirs, offload, plain


def _steps(ours, theirs, offload, plain, n):
    for _ in range(n):
        for p, q in zip(ours, theirs):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        offload.step()
        plain.step()


def test_offloaded_prefix_comes_closest_to_the_fraction():
    assert offloaded_prefix([10, 30, 5, 55], 0.5) == 3  # 45 of 100 (taking the 55 would make it 100)
    assert offloaded_prefix([10, 30, 5, 55], 1.0) == 4
    assert offloaded_prefix([10, 30, 5, 55], 0.0) == 0
    assert offloaded_prefix([10, 30, 5, 55], 0.3) == 2  # 40 is closer to 30 than 10 is


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_host_step_equals_torch_adamw_and_state_lives_apart(fraction):
    ours, theirs, offload, plain = _twins(fraction)
    _steps(ours, theirs, offload, plain, 4)
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))
    offloaded = offload.offloaded_params()
    assert offload.last_host_elements == sum(p.numel() for p in offloaded) == (45 if fraction == 0.5 else 100)
    for p in offloaded:  # master copy and moments: their own host storage, not the parameter's
        ptrs = {offload._master[p].data_ptr(), offload.state[p]["exp_avg"].data_ptr(),
                offload.state[p]["exp_avg_sq"].data_ptr(), p.data_ptr()}
        assert len(ptrs) == 4
        assert torch.equal(offload._master[p], p)
    # torch's state layout: the state dict loads into a plain AdamW, which then steps the same
    saved = offload.state_dict()
    assert saved["param_groups"] == plain.state_dict()["param_groups"]
    reloaded = torch.optim.AdamW([{"params": theirs[:2]}, {"params": theirs[2:]}], lr=1e-2)
    reloaded.load_state_dict(copy.deepcopy(saved))  # torch would share the tensors otherwise
    _steps(ours, theirs, offload, reloaded, 1)
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))


def test_host_copies_are_reread_after_a_load():
    """A checkpoint load writes the device parameters: the next host step starts from them."""
    ours, theirs, offload, plain = _twins(1.0)
    _steps(ours, theirs, offload, plain, 2)
    with torch.no_grad():
        for p, q in zip(ours, theirs):
            p.mul_(0.5)
            q.mul_(0.5)
    offload.load_state_dict(copy.deepcopy(plain.state_dict()))
    _steps(ours, theirs, offload, plain, 2)
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_views_of_the_parameters_are_stepped_in_place(fraction):
    """The distributed optimizer steps fp32 parameters through views (non-leaf tensors), which torch's
    optimizers refuse: ours takes them, steps them as AdamW steps leaves, and the parameters change."""
    torch.manual_seed(0)
    flat = torch.nn.Parameter(torch.randn(sum(SIZES)))
    theirs = [torch.nn.Parameter(t.detach().clone()) for t in flat.detach().split(SIZES)]
    ours = list(flat.view(-1).split(SIZES))  # what DistributedOptimizer puts in its groups for fp32
    assert not any(p.is_leaf for p in ours)
    offload = HostOffloadAdam([{"params": ours[:2]}, {"params": ours[2:]}], lr=1e-2, betas=(0.9, 0.999),
                              eps=1e-8, weight_decay=0.1, decoupled_weight_decay=True, fraction=fraction,
                              device_type="cpu")
    assert all(a is b for a, b in zip(offload.param_groups[0]["params"] + offload.param_groups[1]["params"], ours))
    plain = torch.optim.AdamW([{"params": theirs[:2]}, {"params": theirs[2:]}], lr=1e-2, weight_decay=0.1)
    before = flat.detach().clone()
    _steps(ours, theirs, offload, plain, 3)
    assert not torch.equal(flat.detach(), before)
    assert torch.equal(flat.detach(), torch.cat([q.detach() for q in theirs]))


NPU_CHILD = r"""
import json, torch, torch_npu
from adaptor.memory.optimizer_offload import HostOffloadAdam
torch.manual_seed(0)
ours = [torch.nn.Parameter(torch.randn(n, device="npu")) for n in (10, 30, 5, 55)]
theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
opt = HostOffloadAdam(ours, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                      decoupled_weight_decay=True, fraction=0.5, device_type="npu", overlap=True)
ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1)
torch_npu.calls.clear()
for _ in range(3):
    for p, q in zip(ours, theirs):
        g = torch.randn_like(p)
        p.grad, q.grad = g.clone(), g.clone()
    opt.step(); ref.step()
off = opt.offloaded_params()
facts = {
    "equal": all(torch.equal(p, q) for p, q in zip(ours, theirs)),
    "host_elements": opt.last_host_elements,
    "separate": all(len({opt._master[p].data_ptr(), opt._grad[p].data_ptr(), opt.state[p]["exp_avg"].data_ptr(),
                         opt.state[p]["exp_avg_sq"].data_ptr(), p.data_ptr(), p.grad.data_ptr()}) == 6 for p in off),
    "calls": sorted({c[0] for c in torch_npu.calls}),
}
print("FACTS" + json.dumps(facts))
"""


def test_npu_standin_copies_are_real_and_use_a_side_stream():
    """On the stand-in, npu tensors are CPU tensors: the host buffers must still be their own storage."""
    out = run_child(NPU_CHILD, env=standin_env(ADAPTOR_BACKEND="npu"), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = tagged_json(out.stdout)
    assert facts["equal"] and facts["separate"], facts
    assert facts["host_elements"] == 45
    assert {"Stream", "Event"} <= set(facts["calls"]), facts["calls"]


def _validate(argv_flags: list[str], **values):
    args = argparse.Namespace(optimizer_offload_fraction=1.0, optimizer_cpu_offload=False, optimizer="adam",
                              use_precision_aware_optimizer=False, use_torch_fsdp2=False, use_megatron_fsdp=False)
    vars(args).update(values)
    explicit = {d for d, f in {"optimizer_offload_fraction": "--optimizer-offload-fraction",
                               "overlap_cpu_optimizer_d2h_h2d": "--overlap-cpu-optimizer-d2h-h2d"}.items()
                if f in argv_flags}
    ctx = FeatureContext(backend=Backend("cpu", "gloo", "detected"), flags=argparse.Namespace(),
                         explicit=explicit, argv=argv_flags)
    OptimizerOffload().validate(args, ctx)
    return args


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_fraction_outside_zero_one_is_one_line(fraction):
    with pytest.raises(ArgumentError, match=r"--optimizer-offload-fraction .* \[0, 1\]"):
        _validate(["--optimizer-cpu-offload", "--optimizer-offload-fraction"], optimizer_cpu_offload=True,
                  optimizer_offload_fraction=fraction)


def test_tuning_flag_without_the_switch_and_fsdp2_are_refused():
    with pytest.raises(ArgumentError, match="tunes --optimizer-cpu-offload"):
        _validate(["--overlap-cpu-optimizer-d2h-h2d"])
    with pytest.raises(ArgumentError, match="FSDP"):
        _validate(["--optimizer-cpu-offload"], optimizer_cpu_offload=True, use_torch_fsdp2=True)
    args = _validate(["--optimizer-cpu-offload"], optimizer_cpu_offload=True, optimizer_offload_fraction=0.25)
    assert (args.optimizer_cpu_offload, args.host_optimizer_offload_fraction) == (False, 0.25)
