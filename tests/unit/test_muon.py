"""``--optimizer muon`` on torch.optim.Muon (patches.optimizers.muon, adaptor.optimizers.muon).

One step on a 2-D weight against Megatron's Muon written out here (momentum EMA, nesterov, decoupled
decay, Newton-Schulz with the 'simple' coefficients, the scale modes' shape factors), Megatron's own
optimizer factory routing parameters between Muon and Adam, and the one-line refusals.
"""
from __future__ import annotations

import argparse

import pytest
import torch

from adaptor.optimizers.muon import MegatronMuon, optimizer_kwargs, unsupported

SIMPLE = (3.4445, -4.7750, 2.0315)


def newton_schulz(m: torch.Tensor, steps: int) -> torch.Tensor:
    """Megatron's orthogonalisation in float64: Frobenius-normalise, wide side, X <- aX + (bA + cA^2)X."""
    a, b, c = SIMPLE
    x = m.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


SCALE = {  # emerging-optimizers' get_muon_scale_factor(size_out, size_in, mode)
    "spectral": lambda o, i: max(o, i) ** 0.5,
    "shape_scaling": lambda o, i: max(1, o / i) ** 0.5,
    "unit_rms_norm": lambda o, i: (o / i) ** 0.5,
}


def megatron_muon_steps(p, grads, *, lr, wd, mu, nesterov, steps, mode, extra):
    p, buf = p.double().clone(), torch.zeros_like(p, dtype=torch.float64)
    for g in grads:
        g = g.double()
        p = p - lr * wd * p
        buf = mu * buf + (1 - mu) * g
        update = (1 - mu) * g + mu * buf if nesterov else buf
        p = p - lr * SCALE[mode](*p.shape) * extra * newton_schulz(update, steps)
    return p


def config(megatron: bool = False, **overrides):
    """Megatron's OptimizerConfig for muon (or its muon fields alone, without importing Megatron)."""
    values = dict(optimizer="muon", lr=2e-2, weight_decay=0.1, muon_momentum=0.9, muon_nesterov=True,
                  muon_num_ns_steps=5, muon_scale_mode="spectral", muon_extra_scale_factor=1.0,
                  muon_coefficient_type="simple", muon_split_qkv=False)
    values.update(overrides)
    if not megatron:
        return argparse.Namespace(**values)
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(**values)


@pytest.mark.parametrize("shape", [(48, 16), (16, 40)])
@pytest.mark.parametrize("mode,nesterov,extra", [("spectral", True, 1.0), ("shape_scaling", False, 1.0),
                                                 ("unit_rms_norm", True, 0.5)])
def test_steps_equal_megatrons_muon_written_out(shape, mode, nesterov, extra):
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(*shape, generator=gen)
    grads = [torch.randn(*shape, generator=gen) for _ in range(3)]
    cfg = config(muon_scale_mode=mode, muon_nesterov=nesterov, muon_extra_scale_factor=extra)
    p = torch.nn.Parameter(start.clone())
    opt = MegatronMuon([p], **optimizer_kwargs(cfg))
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want = megatron_muon_steps(start, grads, lr=cfg.lr, wd=cfg.weight_decay, mu=cfg.muon_momentum,
                               nesterov=nesterov, steps=5, mode=mode, extra=extra)
    moved = (want - start.double()).abs().max().item()
    # torch runs Newton-Schulz in bf16 (Megatron's fp32_matmul_prec 'medium'): a few percent of a step.
    assert (p.detach().double() - want).abs().max().item() < 0.05 * moved
    assert opt.param_groups[0]["lr"] == cfg.lr and opt.param_groups[0]["weight_decay"] == cfg.weight_decay


def test_update_scale_equals_torch_muon_with_a_larger_lr_and_a_smaller_decay():
    gen = torch.Generator().manual_seed(1)
    start, grad = torch.randn(32, 24, generator=gen), torch.randn(32, 24, generator=gen)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    MegatronMuon([ours], lr=1e-2, weight_decay=0.2, update_scale=5.0, adjust_lr_fn="match_rms_adamw")
    opt = MegatronMuon([ours], lr=1e-2, weight_decay=0.2, update_scale=5.0, adjust_lr_fn="match_rms_adamw")
    ref = torch.optim.Muon([theirs], lr=5e-2, weight_decay=0.04, adjust_lr_fn="match_rms_adamw")
    ours.grad, theirs.grad = grad.clone(), grad.clone()
    opt.step()
    ref.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=1e-7)


@pytest.fixture(scope="module")
def model_parallel(cpu_training_process):
    from megatron.core import parallel_state as ps

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1, store=torch.distributed.HashStore())
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel()


def test_megatrons_factory_gives_muon_the_matrices_and_adam_the_rest(model_parallel):
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    model_parallel_cuda_manual_seed(1)
    tc = TransformerConfig(num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                           num_query_groups=2, kv_channels=8, qk_layernorm=True, normalization="RMSNorm",
                           gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                           bias_activation_fusion=False, use_cpu_initialization=True)
    model = GPTModel(tc, get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"), vocab_size=64,
                     max_sequence_length=16, share_embeddings_and_output_weights=False,
                     position_embedding_type="rope")
    names = {id(p): n for n, p in model.named_parameters()}
    opt = get_megatron_optimizer(config(megatron=True), [model])
    owner = {}
    for chained in opt.chained_optimizers:
        for group in chained.optimizer.param_groups:
            for p in group["params"]:
                owner[names[id(p)]] = type(chained.optimizer).__name__
    assert set(owner) == set(names.values())
    muon = {n for n, o in owner.items() if o == "MegatronMuon"}
    assert muon == {n for n, p in model.named_parameters()
                    if p.dim() == 2 and "embedding" not in n and "output_layer" not in n}, owner
    assert len(muon) == 4  # linear_qkv, linear_proj, linear_fc1, linear_fc2
    assert {owner[n] for n in set(owner) - muon} == {"AdamW"}, owner
    # Megatron's Adam fallback of no emerging-optimizers package stays put after the build.
    import megatron.core.optimizer as m
    assert m.HAVE_EMERGING_OPTIMIZERS is False


def _args(**overrides):
    values = dict(optimizer="muon", use_distributed_optimizer=False, muon_coefficient_type="simple",
                  muon_split_qkv=False, muon_fp32_matmul_prec="medium", muon_tp_mode="blockwise",
                  tensor_model_parallel_size=1, muon_scalar_optimizer="adam", muon_num_ns_steps=5,
                  muon_extra_scale_factor=1.0, muon_momentum=0.9, fp16=False, ckpt_format="torch_dist")
    values.update(overrides)
    return argparse.Namespace(**values)


@pytest.mark.parametrize("overrides,words", [
    ({}, None),
    ({"muon_tp_mode": "duplicated"}, None),  # one shard at TP=1: the same matrix
    ({"muon_coefficient_type": "quintic"}, "--muon-coefficient-type simple"),
    ({"muon_split_qkv": True}, "--muon-no-split-qkv"),
    ({"use_distributed_optimizer": True}, "layer-wise"),
    ({"optimizer": "dist_muon"}, "layer-wise"),
    ({"muon_fp32_matmul_prec": "high"}, "bf16"),
    ({"muon_tp_mode": "duplicated", "tensor_model_parallel_size": 2}, "blockwise"),
    ({"muon_tp_mode": "distributed"}, "blockwise"),
    ({"muon_scalar_optimizer": "lion"}, "use adam"),
    ({"muon_num_ns_steps": 0}, "[1, 99]"),
    ({"ckpt_format": "safetensors"}, "torch_dist"),
])
def test_what_torch_muon_cannot_give_is_one_line(overrides, words):
    why = unsupported(_args(**overrides))
    if words is None:
        assert why is None
    else:
        assert why and words in why and "\n" not in why


def test_megatrons_defaults_are_refused_until_the_two_flags_torch_needs_are_given():
    """Through Megatron's own parser: its default quintic coefficients and QKV split cannot run here."""
    from megatron.training.arguments import add_megatron_arguments

    from adaptor.backend import Backend
    from adaptor.features import ArgumentError, FeatureContext
    from patches.optimizers.muon import TorchMuon

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    ctx = FeatureContext(backend=Backend("cpu", "gloo", "detected"), flags=argparse.Namespace())
    with pytest.raises(ArgumentError, match="pass --muon-coefficient-type simple"):
        TorchMuon().validate(parser.parse_args(["--optimizer", "muon"]), ctx)
    with pytest.raises(ArgumentError, match="pass --muon-no-split-qkv"):
        TorchMuon().validate(parser.parse_args(["--optimizer", "muon", "--muon-coefficient-type", "simple"]), ctx)
    TorchMuon().validate(parser.parse_args(["--optimizer", "muon", "--muon-coefficient-type", "simple",
                                            "--muon-no-split-qkv"]), ctx)
    with pytest.raises(ArgumentError, match="layer-wise"):
        TorchMuon().validate(parser.parse_args(["--optimizer", "muon", "--muon-coefficient-type", "simple",
                                                "--muon-no-split-qkv", "--use-distributed-optimizer"]), ctx)
