"""Megatron's ``--optimizer muon`` on ``torch.optim.Muon``.

Megatron-LM 0.19 builds Muon from the emerging-optimizers package (``TensorParallelMuon``). Per 2-D
weight, one step of it is: decoupled weight decay ``p -= lr*wd*p``; the momentum EMA
``B = mu*B + (1-mu)*g``; the update ``B`` (or ``(1-mu)*g + mu*B`` with nesterov); the Newton-Schulz
iteration on it (normalised by its Frobenius norm, the wide orientation, bf16 matmuls at
``fp32_matmul_prec=medium``); ``p -= lr * scale(shape) * extra_scale_factor * O``.

``torch.optim.Muon`` computes the same momentum, nesterov, decoupled decay and Newton-Schulz
iteration with one coefficient triple repeated ``ns_steps`` times, (3.4445, -4.7750, 2.0315), which
is Megatron's ``simple`` coefficient type, in bf16. Its ``adjust_lr_fn`` multiplies the learning
rate of the update (not of the decay) by a shape factor:

==================  =======================  ================================  ==========
``--muon-scale-mode``  Megatron's factor       torch's ``adjust_lr_fn``             times
==================  =======================  ================================  ==========
spectral            sqrt(max(A, B))          match_rms_adamw: 0.2*sqrt(max(A,B))  5
shape_scaling       sqrt(max(1, A/B))        original                           1
unit_rms_norm       sqrt(A/B)                spectral_unclamped                 1
==================  =======================  ================================  ==========

The remaining factor (the ``times`` column, times ``--muon-extra-scale-factor``) is
:class:`MegatronMuon`'s ``update_scale``: each step runs torch's Muon with ``lr*k`` and
``weight_decay/k``, so the decay stays ``lr*wd`` and the update gains ``k``.

What torch's Muon cannot give is refused by :func:`unsupported` in one line: other coefficient
types (quintic, Megatron's default, cycles five triples), the per-block QKV orthogonalisation
(``--muon-split-qkv``, Megatron's default), fp32 Newton-Schulz (``--muon-fp32-matmul-prec`` high or
low), the gathered or distributed tensor-parallel modes, Lion for the scalar parameters and the
layer-wise distributed optimizer (``--use-distributed-optimizer``/``dist_muon``).
"""
from __future__ import annotations

import torch

#: --muon-scale-mode -> (torch's adjust_lr_fn, the factor left over).
SCALE_MODES = {
    "spectral": ("match_rms_adamw", 5.0),
    "shape_scaling": ("original", 1.0),
    "unit_rms_norm": ("spectral_unclamped", 1.0),
}
#: Megatron's ``simple`` coefficients, the triple torch's Muon repeats.
SIMPLE_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


class MegatronMuon(torch.optim.Muon):
    """``torch.optim.Muon`` with a per-group ``update_scale`` on the update and not on the decay."""

    def __init__(self, params, *, update_scale: float = 1.0, **kwargs) -> None:
        if not update_scale > 0:
            raise ValueError(f"update_scale must be positive, not {update_scale}")
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            group.setdefault("update_scale", update_scale)

    @torch.no_grad()
    def step(self, closure=None):
        held = [(group["lr"], group["weight_decay"]) for group in self.param_groups]
        for group in self.param_groups:
            k = group["update_scale"]
            group["lr"], group["weight_decay"] = group["lr"] * k, group["weight_decay"] / k
        try:
            return super().step(closure)
        finally:
            for group, (lr, wd) in zip(self.param_groups, held):
                group["lr"], group["weight_decay"] = lr, wd


def init_state(optimizer, config=None) -> None:
    """Momentum buffers for every parameter (checkpoints need state before the first step)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def optimizer_kwargs(config) -> dict:
    """MegatronMuon's arguments from Megatron's OptimizerConfig (after :func:`unsupported` passed)."""
    adjust_lr_fn, factor = SCALE_MODES[config.muon_scale_mode]
    return dict(
        lr=config.lr, weight_decay=config.weight_decay, momentum=config.muon_momentum,
        nesterov=config.muon_nesterov, ns_coefficients=SIMPLE_COEFFICIENTS, ns_steps=config.muon_num_ns_steps,
        adjust_lr_fn=adjust_lr_fn, update_scale=factor * config.muon_extra_scale_factor,
    )


def unsupported(args) -> str | None:
    """One line saying what of ``--optimizer muon``'s settings torch's Muon cannot give, or None."""
    if args.optimizer == "dist_muon" or getattr(args, "use_distributed_optimizer", False):
        return ("--optimizer muon with --use-distributed-optimizer (or dist_muon) is Megatron's layer-wise "
                "distributed optimizer, which is not supported here; drop --use-distributed-optimizer")
    if args.muon_coefficient_type != "simple":
        return (f"--muon-coefficient-type {args.muon_coefficient_type}: torch.optim.Muon repeats one "
                "Newton-Schulz coefficient triple, Megatron's 'simple'; pass --muon-coefficient-type simple")
    if args.muon_split_qkv:
        return ("--optimizer muon orthogonalises the fused QKV weight as one matrix here (torch.optim.Muon); "
                "Megatron's default splits it per head group, so pass --muon-no-split-qkv")
    if args.muon_fp32_matmul_prec != "medium":
        return (f"--muon-fp32-matmul-prec {args.muon_fp32_matmul_prec}: torch.optim.Muon runs Newton-Schulz "
                "in bf16 (Megatron's 'medium'); drop it")
    if args.muon_tp_mode == "distributed" or (args.muon_tp_mode == "duplicated" and args.tensor_model_parallel_size > 1):
        return (f"--muon-tp-mode {args.muon_tp_mode}: torch.optim.Muon orthogonalises each tensor-parallel "
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
    if not args.muon_extra_scale_factor > 0:
        return f"--muon-extra-scale-factor multiplies the update: give a positive value, not {args.muon_extra_scale_factor}"
    if args.muon_momentum < 0:
        return f"--muon-momentum is a momentum factor: give a value >= 0, not {args.muon_momentum}"
    return None
