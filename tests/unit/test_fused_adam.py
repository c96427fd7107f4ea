"""torch's fused Adam in place of Megatron's fallback loop: same update, one kernel per parameter."""
from __future__ import annotations

import torch

from patches.fusions.fused_adam import use_fused_kernel


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (32,), (128, 64)]
    params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    grads = [[torch.randn(*s, generator=g) for s in shapes] for _ in range(4)]
    return params, grads


def _train(switch: bool):
    params, grads = _params()
    opt = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    if switch:
        assert use_fused_kernel(opt)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
    names = {e.key for e in prof.key_averages()}
    return [p.detach().clone() for p in params], names, opt


def test_the_switched_optimizer_runs_the_fused_kernel_and_matches_the_loop():
    loop, loop_ops, _ = _train(switch=False)
    fused, fused_ops, opt = _train(switch=True)
    assert all(g["fused"] and not g["foreach"] for g in opt.param_groups)
    assert any("_fused_adamw" in n for n in fused_ops), sorted(fused_ops)
    assert not any("_fused_adamw" in n for n in loop_ops)
    # Same arithmetic in another order: a few fp32 ulps after 4 steps of lr 1e-2.
    for a, b in zip(loop, fused):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_group_the_kernel_cannot_take_is_left_alone():
    params, _ = _params()
    opt = torch.optim.AdamW(params, lr=1e-3, capturable=True)
    assert not use_fused_kernel(opt)
    assert not opt.param_groups[0]["fused"]


def test_a_group_mixing_dtensors_and_plain_tensors_is_left_alone(tmp_path):
    """FSDP2 can leave a module unsharded: one kernel call cannot take DTensors and tensors together."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = torch.nn.Parameter(distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]))
        plain = torch.nn.Parameter(torch.randn(4))
        mixed = torch.optim.AdamW([sharded, plain], lr=1e-3)
        assert not use_fused_kernel(mixed)
        only_sharded = torch.optim.AdamW([sharded], lr=1e-3)
        assert use_fused_kernel(only_sharded)
        sharded.grad = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
        only_sharded.step()  # the fused kernel takes a group of DTensors
    finally:
        dist.destroy_process_group()
