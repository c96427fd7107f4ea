"""``--fp16`` under FSDP2: the loss-scaled ``FP32Optimizer`` over sharded gradients, on two gloo ranks.

Each rank holds half of a DTensor parameter (``Shard(0)``) and its gradient, as FSDP2 leaves them.
An inf in rank 1's half only must skip the step on both ranks (rank 0's gradient is finite, so
without the reduction over ranks rank 0 would step and the shards would drift apart) and halve the
scale (hysteresis 1); a finite step then unscales the gradients and updates both halves. The
scaler's state (scale, growth and hysteresis trackers) saved in the optimizer state dict comes back
in a fresh optimizer. The training runs: tests/e2e/test_fsdp2_fp16.py.
"""
from __future__ import annotations

from helpers.processes import two_gloo_ranks
from helpers.warm_launcher import base_env

CHILD = r"""
import torch
import torch.distributed as dist

def build(mesh, value):
    from torch.distributed.tensor import Shard, distribute_tensor
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler
    from megatron.core.optimizer.optimizer import FP32Optimizer
    from adaptor.fsdp2.loss_scaling import LossScaledFP32Optimizer
    param = torch.nn.Parameter(distribute_tensor(value.clone(), mesh, [Shard(0)]))
    config = OptimizerConfig(lr=0.1, clip_grad=0.0, fp16=False, bf16=False)
    plain = FP32Optimizer(torch.optim.SGD([param], lr=0.5), config, None)
    plain.grad_stats_parallel_group = "kept"  # what Megatron sets on the optimizer it built
    scaler = DynamicGradScaler(initial_scale=1024.0, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                               growth_interval=1000, hysteresis=1)
    return param, LossScaledFP32Optimizer.from_fp32(plain, scaler)

def set_grad(param, local):
    from torch.distributed.tensor import DTensor
    param.grad = DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                                    shape=param.shape, stride=param.stride())

def rank_main(rank, store, results):
    import adaptor  # noqa: F401  (the cpu backend: Megatron's "cuda" tensors land on the host)
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    param, opt = build(mesh, torch.ones(4, 3))
    out = {"kept_attribute": opt.grad_stats_parallel_group, "scaled_loss": opt.scale_loss(torch.tensor(2.0)).item()}
    grad = torch.full((2, 3), 1024.0)
    if rank == 1:
        grad[1, 2] = float("inf")
    set_grad(param, grad)
    before = param._local_tensor.clone()
    success, _, _ = opt.step()
    out["overflow"] = {"success": success, "unchanged": torch.equal(param._local_tensor, before),
                       "scale": opt.get_loss_scale().item()}
    set_grad(param, torch.full((2, 3), 512.0))  # 1.0 once unscaled by 512
    success, _, _ = opt.step()
    out["finite"] = {"success": success, "grad": param.grad._local_tensor.tolist()[0][0],
                     "param": param._local_tensor.tolist()[0][0], "scale": opt.get_loss_scale().item()}
    opt.grad_scaler._growth_tracker = 7  # something a fresh scaler would not have
    saved = opt.state_dict()
    _, fresh = build(mesh, torch.ones(4, 3))
    fresh.load_state_dict(saved)
    out["round_trip"] = {key: (value.item() if torch.is_tensor(value) else value)
                         for key, value in fresh.grad_scaler.state_dict().items()}
    _, fresh2 = build(mesh, torch.ones(4, 3))
    fresh2.load_grad_scaler({"scale": torch.tensor([64.0]), "growth_tracker": 3, "hysteresis_tracker": 0})
    out["in_place"] = {key: (value.item() if torch.is_tensor(value) else value)
                       for key, value in fresh2.grad_scaler.state_dict().items()}
    results[rank] = out
    dist.destroy_process_group()

"""


def test_an_inf_on_one_rank_skips_the_step_on_both_and_the_scaler_state_round_trips():
    facts = two_gloo_ranks(CHILD, env=base_env({"ADAPTOR_QUIET": "1"}))
    for rank in ("0", "1"):
        got = facts[rank]
        assert got["kept_attribute"] == "kept", got
        assert got["scaled_loss"] == 2048.0, got  # scale_loss multiplies by the loss scale
        # rank 0's gradient was finite: it skips only because rank 1 found an inf
        assert got["overflow"] == {"success": False, "unchanged": True, "scale": 512.0}, (rank, got)
        # unscaled before the step: 512 / 512 = 1, SGD lr 0.5 takes the weight from 1 to 0.5
        assert got["finite"] == {"success": True, "grad": 1.0, "param": 0.5, "scale": 512.0}, (rank, got)
        assert got["round_trip"] == {"scale": 512.0, "growth_tracker": 7, "hysteresis_tracker": 0}, got
        assert got["in_place"] == {"scale": 64.0, "growth_tracker": 3, "hysteresis_tracker": 0}, got
