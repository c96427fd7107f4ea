"""LoRA linears at TP=2 against the same layer computed whole, forward and backward, on gloo.

    torchrun --nproc_per_node 2 tests/scripts/lora_tp_parity.py

Every rank builds the same full weights, adapters, input and output gradient from one seed and the
reference ``y = x W^T + s * (x A^T) B^T`` with its gradients; then it builds a
``LoraColumnParallelLinear`` / ``LoraRowParallelLinear`` (base weight frozen, as in training) holding
its own parts, runs forward and backward on its part of the input with its part of the output
gradient, and compares output and gradients (of the input and of both adapters) with the
reference's parts. Cases: plain, sequence parallel, and MoE experts whose base linear leaves the
reduction to the token dispatcher (the dispatcher's sums are done here with all-reduces). It also
checks how ``sharded_state_dict`` lays the adapters out. Prints ``CASE <name> ok`` per case and
exits non-zero on the first difference.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("ADAPTOR_BACKEND", "cpu")
import adaptor  # noqa: F401,E402  (the cpu backend's device and RNG redirections)

S, B, IN, OUT, R, ALPHA = 8, 2, 12, 16, 4, 8.0
TOL = 1e-5


def close(name, got, want):
    err = (got - want).abs().max().item()
    scale = max(want.abs().max().item(), 1e-6)
    if got.shape != want.shape or err > TOL * scale:
        raise SystemExit(f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)}, max error {err:.3e}")


def config(sp: bool):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=IN, num_attention_heads=2, tensor_model_parallel_size=2,
                             expert_tensor_parallel_size=2, sequence_parallel=sp, use_cpu_initialization=True,
                             params_dtype=torch.float32, gated_linear_unit=True, add_bias_linear=False)


def reference(seed):
    g = torch.Generator().manual_seed(seed)
    w, a = torch.randn(OUT, IN, generator=g), torch.randn(R, IN, generator=g)
    b, x = torch.randn(OUT, R, generator=g), torch.randn(S, B, IN, generator=g)
    grad = torch.randn(S, B, OUT, generator=g)
    xr, ar, br = (t.clone().requires_grad_(True) for t in (x, a, b))
    y = F.linear(xr, w) + (ALPHA / R) * F.linear(F.linear(xr, ar), br)
    y.backward(grad)
    return dict(w=w, a=a, b=b, x=x, grad=grad, y=y.detach(), dx=xr.grad, da=ar.grad, db=br.grad)


def chunk(t, dim, rank):
    return t.chunk(2, dim)[rank]


def run_case(name, kind, sp, expert, rank):
    from adaptor.lora.layers import LoraColumnParallelLinear, LoraConfig, LoraRowParallelLinear

    ref = reference(7)
    lora = LoraConfig(r=R, alpha=ALPHA, targets=("linear_fc1", "linear_fc2"))
    common = dict(config=config(sp), init_method=torch.nn.init.zeros_, bias=False, is_expert=expert, lora=lora)
    if kind == "column":
        layer = LoraColumnParallelLinear(IN, OUT, gather_output=False, tp_comm_buffer_name="fc1", **common)
        weight, a, b = chunk(ref["w"], 0, rank), ref["a"], chunk(ref["b"], 0, rank)
        x = chunk(ref["x"], 0, rank) if sp and not expert else ref["x"]
        grad = chunk(ref["grad"], 2, rank)
    else:
        layer = LoraRowParallelLinear(IN, OUT, input_is_parallel=True, skip_bias_add=True, tp_comm_buffer_name="fc2",
                                      **common)
        weight, a, b = chunk(ref["w"], 1, rank), chunk(ref["a"], 1, rank), ref["b"]
        x = chunk(ref["x"], 2, rank)
        grad = chunk(ref["grad"], 0, rank) if sp and not expert else ref["grad"]
    assert layer.explicit_expert_comm == expert
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.lora_A.weight.copy_(a)
        layer.lora_B.weight.copy_(b)
    layer.weight.requires_grad_(False)
    x = x.clone().requires_grad_(True)
    y, _ = layer(x)
    y.backward(grad)
    dx = x.grad
    if kind == "column":
        if expert:  # the dispatcher sums the ranks' input gradients
            dist.all_reduce(dx)
        close(f"{name} y", y, chunk(ref["y"], 2, rank))
        close(f"{name} dx", dx, chunk(ref["dx"], 0, rank) if sp and not expert else ref["dx"])
        close(f"{name} dA", layer.lora_A.weight.grad, ref["da"])
        close(f"{name} dB", layer.lora_B.weight.grad, chunk(ref["db"], 0, rank))
    else:
        if expert:  # the dispatcher sums the ranks' outputs
            y = y.detach().clone()
            dist.all_reduce(y)
        close(f"{name} y", y, chunk(ref["y"], 0, rank) if sp and not expert else ref["y"])
        close(f"{name} dx", dx, chunk(ref["dx"], 2, rank))
        close(f"{name} dA", layer.lora_A.weight.grad, chunk(ref["da"], 1, rank))
        close(f"{name} dB", layer.lora_B.weight.grad, ref["db"])
    # Merged weights give the same output (an expert row linear's: the same sum over the ranks).
    with torch.no_grad():
        before, _ = layer(x)
        layer.merge_()
        merged, _ = layer(x)
        layer.unmerge_()
        if expert and kind == "row":
            dist.all_reduce(before)
            dist.all_reduce(merged)
    close(f"{name} merged", merged, before)
    close(f"{name} unmerged weight", layer.weight, weight)
    return layer


def check_sharding(rank):
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    from adaptor.lora.layers import LoraColumnParallelLinear, LoraConfig, LoraRowParallelLinear

    lora = LoraConfig(r=R, alpha=ALPHA, targets=("linear_qkv", "linear_proj", "linear_fc1"))
    meta = {"dp_cp_group": ps.get_data_parallel_group(with_context_parallel=True)}
    common = dict(config=config(False), init_method=torch.nn.init.zeros_, bias=False, lora=lora)
    column = LoraColumnParallelLinear(IN, OUT, gather_output=False, tp_comm_buffer_name="qkv", **common)
    sd = column.sharded_state_dict("c.", (), meta)
    a, b = sd["c.lora_A.weight"], sd["c.lora_B.weight"]
    assert isinstance(a, ShardedTensor) and a.global_shape == (R, IN) and a.local_shape == (R, IN), a
    assert a.replica_id[1] == rank, a.replica_id  # replicated over TP: rank 0 holds the main copy
    assert b.global_shape == (OUT, R) and b.local_shape == (OUT // 2, R) and b.global_offset == (rank * OUT // 2, 0), b
    row = LoraRowParallelLinear(IN, OUT, input_is_parallel=True, skip_bias_add=True, tp_comm_buffer_name="proj",
                                **common)
    sd = row.sharded_state_dict("r.", (), meta)
    a, b = sd["r.lora_A.weight"], sd["r.lora_B.weight"]
    assert a.global_shape == (R, IN) and a.local_shape == (R, IN // 2) and a.global_offset == (0, rank * IN // 2), a
    assert b.global_shape == (OUT, R) and b.local_shape == (OUT, R) and b.replica_id[1] == rank, b
    fc1 = LoraColumnParallelLinear(IN, OUT, gather_output=False, tp_comm_buffer_name="fc1", stride=2, **common)
    sd = fc1.sharded_state_dict("f.", (), meta)
    assert isinstance(sd["f.lora_B.weight"], ShardedTensorFactory), sd["f.lora_B.weight"]  # SwiGLU halves
    # Every rank drew the same replicated A and its own slice of one row-parallel A.
    gathered = [torch.empty_like(row.lora_A.weight) for _ in range(2)]
    dist.all_gather(gathered, row.lora_A.weight.detach().contiguous())
    full = [torch.empty_like(column.lora_A.weight) for _ in range(2)]
    dist.all_gather(full, column.lora_A.weight.detach().contiguous())
    assert torch.equal(full[0], full[1]), "replicated lora_A differs between ranks"
    assert not torch.equal(gathered[0], gathered[1]), "row-parallel lora_A: both ranks hold the same slice"
    assert not column.lora_B.weight.any() and not row.lora_B.weight.any(), "lora_B must start at zero"


def main():
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ps.initialize_model_parallel(tensor_model_parallel_size=2, expert_tensor_parallel_size=2)
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    for kind in ("column", "row"):
        for sp, expert, label in ((False, False, "plain"), (True, False, "sequence_parallel"), (False, True, "expert")):
            name = f"{kind}_{label}"
            run_case(name, kind, sp, expert, rank)
            if rank == 0:
                print(f"CASE {name} ok", flush=True)
    check_sharding(rank)
    if rank == 0:
        print("CASE sharded_state_dict ok", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
