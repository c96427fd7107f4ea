"""Megatron's ``--optimizer muon``: :class:`MegatronMuon`, its ``TensorParallelMuon`` step written out.

Megatron-LM 0.19 builds Muon from the emerging-optimizers package (``TensorParallelMuon``), which is
not installed here. Per 2-D weight ``p`` (float32 main parameter) with gradient ``g`` (taken in
float32), one step of it is, in this order:

1. decoupled weight decay ``p -= lr * wd * p``;
2. the momentum EMA ``B = mu*B + (1-mu)*g``, the update ``U = B`` or, with ``--muon-nesterov``,
   ``(1-mu)*g + mu*B``;
3. Newton-Schulz on ``U`` (:func:`adaptor.optimizers.newton_schulz.orthogonalise`: every
   ``--muon-coefficient-type``, ``--muon-num-ns-steps``, ``--muon-fp32-matmul-prec``); with
   ``--muon-split-qkv`` (Megatron's default) a fused QKV weight is split first (below);
4. ``p -= lr * scale(A, B) * extra_scale_factor * O`` per orthogonalised matrix of shape (A, B):

==================  =======================
``--muon-scale-mode``  scale(A, B)
==================  =======================
spectral            sqrt(max(A, B))
shape_scaling       sqrt(max(1, A/B))
unit_rms_norm       sqrt(A/B)
==================  =======================

The QKV split: Megatron's optimizer factory marks each ``linear_qkv.weight`` whose rows divide into
query groups with ``is_qkv`` and ``qkv_split_shapes`` = [heads per group * kv_channels, kv_channels,
kv_channels] (an extra query-sized gate block first with ``--attention-output-gate``). The weight's rows
are [group 0: Q, K, V | group 1: Q, K, V | ...]; Muon gathers the Q rows of every group into one matrix,
the K rows into another and the V rows into a third, orthogonalises and scales each on its own, and puts
the rows back where they came from. Under tensor parallelism (``--muon-tp-mode blockwise``) each rank
holds whole query groups of the weight and does the same with its own rows.

What is not Megatron's Muon here is refused by :func:`unsupported` in one line: the gathered or
distributed tensor-parallel modes and Lion for the scalar parameters. ``--use-distributed-optimizer``
(and the deprecated ``dist_muon``) is Megatron's own layer-wise distributed optimizer, which shards
whole matrices over the data-parallel ranks and steps each with this class.
"""
from __future__ import annotations

import torch

from adaptor.optimizers.newton_schulz import COEFFICIENTS, orthogonalise, schedule

#: --muon-scale-mode -> the factor of an (A, B) orthogonalised matrix (emerging-optimizers' get_muon_scale_factor).
SCALE_MODES = {
    "spectral": lambda a, b: max(a, b) ** 0.5,
    "shape_scaling": lambda a, b: max(1.0, a / b) ** 0.5,
    "unit_rms_norm": lambda a, b: (a / b) ** 0.5,
}


class MegatronMuon(torch.optim.Optimizer):
    """Megatron's ``TensorParallelMuon`` step (blockwise), on one process's parameters."""

    def __init__(self, params, *, lr: float, weight_decay: float = 0.0, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, coefficient_type: str = "quintic",
                 fp32_matmul_prec: str = "medium", scale_mode: str = "spectral",
                 extra_scale_factor: float = 1.0, split_qkv: bool = True) -> None:
        schedule(coefficient_type, ns_steps)  # ValueError now, not at the first step
        if scale_mode not in SCALE_MODES:
            raise ValueError(f"scale_mode is one of {', '.join(SCALE_MODES)}, not {scale_mode!r}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_steps=ns_steps, coefficient_type=coefficient_type, fp32_matmul_prec=fp32_matmul_prec,
                        scale_mode=scale_mode, extra_scale_factor=extra_scale_factor, split_qkv=split_qkv)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for key, value in self.defaults.items():  # groups loaded from a checkpoint saved before a key existed
                group.setdefault(key, value)
            lr, mu = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() != 2:
                    raise ValueError(f"Muon updates 2-D weight matrices, not a {p.dim()}-D parameter")
                g = p.grad.float()
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
                buf = state["momentum_buffer"]
                p.mul_(1 - lr * group["weight_decay"])
                buf.lerp_(g, 1 - mu)
                update = g.lerp(buf, mu) if group["nesterov"] else buf
                p.add_(orthogonalised_update(update, group, _qkv_shapes(p, group)).to(p.dtype), alpha=-lr)
        return loss


def _qkv_shapes(p, group):
    if not group["split_qkv"] or not getattr(p, "is_qkv", False):
        return None
    shapes = getattr(p, "qkv_split_shapes", None)
    if shapes is None or p.shape[0] % sum(shapes):
        raise RuntimeError(f"Muon QKV split: a {tuple(p.shape)} weight does not divide into query groups of "
                           f"{shapes} rows")
    return list(shapes)


def orthogonalised_update(update: torch.Tensor, group: dict, qkv_shapes: list[int] | None = None) -> torch.Tensor:
    """The scaled orthogonalised update of one weight; per Q, K and V block when ``qkv_shapes`` is given."""
    def scaled(m):
        o = orthogonalise(m, group["ns_steps"], group["coefficient_type"], group["fp32_matmul_prec"])
        return o * (SCALE_MODES[group["scale_mode"]](*m.shape) * group["extra_scale_factor"])

    if qkv_shapes is None:
        return scaled(update)
    rows, cols = update.shape
    groups = rows // sum(qkv_shapes)
    blocks = torch.split(update.reshape(groups, sum(qkv_shapes), cols), qkv_shapes, dim=1)
    done = [scaled(b.reshape(-1, cols)).reshape(groups, -1, cols) for b in blocks]
    return torch.cat(done, dim=1).reshape(rows, cols)


def init_state(optimizer, config=None) -> None:
    """Momentum buffers for every parameter (checkpoints need state before the first step)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)


def optimizer_kwargs(config) -> dict:
    """MegatronMuon's arguments from Megatron's OptimizerConfig (after :func:`unsupported` passed)."""
    return dict(
        lr=config.lr, weight_decay=config.weight_decay, momentum=config.muon_momentum,
        nesterov=config.muon_nesterov, ns_steps=config.muon_num_ns_steps,
        coefficient_type=config.muon_coefficient_type, fp32_matmul_prec=config.muon_fp32_matmul_prec,
        scale_mode=config.muon_scale_mode, extra_scale_factor=config.muon_extra_scale_factor,
        split_qkv=config.muon_split_qkv,
    )


def unsupported(args) -> str | None:
    """One line saying what of ``--optimizer muon``'s settings cannot run here, or None."""
    if args.muon_coefficient_type not in COEFFICIENTS:
        return (f"--muon-coefficient-type is one of {', '.join(COEFFICIENTS)} (Megatron's NSCoeffT; 'custom' "
                f"has no flag for its coefficients), not {args.muon_coefficient_type}")
    if args.muon_tp_mode == "distributed" or (args.muon_tp_mode == "duplicated" and args.tensor_model_parallel_size > 1):
        return (f"--muon-tp-mode {args.muon_tp_mode}: Muon here orthogonalises each tensor-parallel "
                "shard on its own (Megatron's 'blockwise'); drop it")
    if getattr(args, "use_torch_fsdp2", False) or getattr(args, "use_megatron_fsdp", False):
        return "--optimizer muon does not run under FSDP in Megatron; drop --use-torch-fsdp2/--use-megatron-fsdp"
    if args.fp16:
        return "--optimizer muon does not run with --fp16 in Megatron; use --bf16 or fp32"
    if args.ckpt_format not in ("torch", "torch_dist"):
        return (f"--optimizer muon saves its state with --ckpt-format torch or torch_dist in Megatron, "
                f"not {args.ckpt_format}; pass one of them")
    if args.muon_scalar_optimizer != "adam":
        return (f"--muon-scalar-optimizer {args.muon_scalar_optimizer} needs the emerging-optimizers package; "
                "use adam")
    if not 1 <= args.muon_num_ns_steps < 100:
        return f"--muon-num-ns-steps is a number of Newton-Schulz steps in [1, 99], not {args.muon_num_ns_steps}"
    try:
        schedule(args.muon_coefficient_type, args.muon_num_ns_steps)
    except ValueError as e:
        return str(e)
    if not args.muon_extra_scale_factor > 0:
        return f"--muon-extra-scale-factor multiplies the update: give a positive value, not {args.muon_extra_scale_factor}"
    if args.muon_momentum < 0:
        return f"--muon-momentum is a momentum factor: give a value >= 0, not {args.muon_momentum}"
    return None
