"""Adam's state created at construction is the state torch's first step creates, so training is bit for bit the same.

Reference: torch.optim.Adam/AdamW's own lazy initialisation (``_init_group``), run on a copy of the same
parameters and gradients. Each flag that changes where or how torch creates the state is covered: the
single-tensor loop, ``foreach``, ``fused`` (what patches.fusions.fused_adam switches on), ``amsgrad``,
and the host-offloading AdamW, whose host-stepped part must get its state on the host. The e2e proof,
a save before the first step resumed bit-exactly in every format and layout:
tests/e2e/test_early_save_matrix.py.
"""
from __future__ import annotations

import pytest
import torch

from adaptor.memory.optimizer_offload import HostOffloadAdam
from patches.checkpoint.optimizer_state_from_start import initialise_state

FLAGS = {
    "loop": dict(foreach=False),
    "foreach": dict(foreach=True),
    "fused": dict(fused=True),
    "amsgrad": dict(foreach=False, amsgrad=True),
    "fused_amsgrad": dict(fused=True, amsgrad=True),
}


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 8), (8,), (4, 4)]
    params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    grads = [[torch.randn(*s, generator=g) for s in shapes] for _ in range(3)]
    return params, grads


def _train(cls, flags, eager: bool, make=None):
    params, grads = _params()
    opt = make(params) if make else cls([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}],
                                        lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **flags)
    before = None
    if eager:
        assert initialise_state(opt) == len(params)
        before = {i: {k: v.clone() for k, v in opt.state[p].items()} for i, p in enumerate(params)}
    for n, step in enumerate(grads):
        for i, (p, g) in enumerate(zip(params, step)):
            p.grad = None if (n == 0 and i == 1) else g.clone()  # one parameter without a gradient at first
        opt.step()
    return params, opt, before


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW], ids=["Adam", "AdamW"])
@pytest.mark.parametrize("flags", FLAGS, ids=list(FLAGS))
def test_eager_state_trains_bit_for_bit_like_torchs_lazy_state(cls, flags):
    lazy_params, lazy, _ = _train(cls, FLAGS[flags], eager=False)
    eager_params, eager, created = _train(cls, FLAGS[flags], eager=True)
    for p in created.values():  # what was created: zeros, and a 0 step where torch would put its own
        assert float(p["step"]) == 0 and all(not v.any() for k, v in p.items() if k != "step")
    for a, b in zip(lazy_params, eager_params):
        assert torch.equal(a, b)
    for pa, pb in zip(lazy_params, eager_params):
        sa, sb = lazy.state[pa], eager.state[pb]
        assert sorted(sa) == sorted(sb)
        assert all(_same(sa[k], sb[k]) for k in sa), {k: (sa[k], sb[k]) for k in sa}


def test_state_already_there_is_left_alone():
    params, grads = _params()
    opt = torch.optim.Adam(params, lr=1e-2)
    for p, g in zip(params, grads[0]):
        p.grad = g
    opt.step()
    stepped = {p: dict(opt.state[p]) for p in params}
    assert initialise_state(opt) == 0
    assert all(opt.state[p][k] is v for p in params for k, v in stepped[p].items())


def test_the_host_offloading_adam_gets_its_host_state_on_the_host():
    def make(params):
        return HostOffloadAdam([{"params": params}], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                               decoupled_weight_decay=True, fraction=0.5, device_type="cpu")

    lazy_params, lazy, _ = _train(None, {}, eager=False, make=make)
    eager_params, eager, _ = _train(None, {}, eager=True, make=make)
    assert eager.last_host_elements > 0
    for a, b in zip(lazy_params, eager_params):
        assert torch.equal(a, b)
    for pa, pb in zip(lazy_params, eager_params):
        assert all(_same(lazy.state[pa][k], eager.state[pb][k]) for k in lazy.state[pa])
