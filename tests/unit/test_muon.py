"""``--optimizer muon`` (patches.optimizers.muon, adaptor.optimizers.muon and .newton_schulz).

Steps on 2-D weights against Megatron's Muon written out here in float64 (momentum EMA, nesterov,
decoupled decay, Newton-Schulz with the 'simple' and 'quintic' coefficients, the scale modes' shape
factors, the per-block QKV split), Megatron's own optimizer factory routing parameters between Muon and
Adam and tagging the QKV weight, and the one-line refusals.
"""
from __future__ import annotations

import argparse

import pytest
import torch

from adaptor.optimizers.muon import MegatronMuon, optimizer_kwargs, unsupported

# The published coefficient triples (emerging-optimizers' muon_utils), typed in again here.
TRIPLES = {
    "simple": [(3.4445, -4.7750, 2.0315)] * 5,
    "quintic": [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)],
}


def newton_schulz(m: torch.Tensor, kind: str) -> torch.Tensor:
    """Megatron's orthogonalisation in float64: Frobenius-normalise, wide side, X <- aX + (bA + cA^2)X."""
    x = m.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    for a, b, c in TRIPLES[kind]:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


SCALE = {  # emerging-optimizers' get_muon_scale_factor(size_out, size_in, mode)
    "spectral": lambda o, i: max(o, i) ** 0.5,
    "shape_scaling": lambda o, i: max(1, o / i) ** 0.5,
    "unit_rms_norm": lambda o, i: (o / i) ** 0.5,
}


def scaled_update(u, kind, mode, extra, qkv=None):
    """One weight's update; with qkv = [q, k, v] rows per query group, each of Q, K and V on its own."""
    if qkv is None:
        return SCALE[mode](*u.shape) * extra * newton_schulz(u, kind)
    per_group, out = sum(qkv), torch.empty_like(u)
    groups = u.shape[0] // per_group
    start = 0
    for size in qkv:  # the rows of this block in every query group, gathered into one matrix
        rows = [g * per_group + start + r for g in range(groups) for r in range(size)]
        out[rows] = scaled_update(u[rows], kind, mode, extra)
        start += size
    return out


def megatron_muon_steps(p, grads, *, lr, wd, mu, nesterov, kind="simple", mode="spectral", extra=1.0, qkv=None):
    p, buf = p.double().clone(), torch.zeros_like(p, dtype=torch.float64)
    for g in grads:
        g = g.double()
        p = p - lr * wd * p
        buf = mu * buf + (1 - mu) * g
        update = (1 - mu) * g + mu * buf if nesterov else buf
        p = p - lr * scaled_update(update, kind, mode, extra, qkv)
    return p


def config(megatron: bool = False, **overrides):
    """Megatron's OptimizerConfig for muon with its defaults (or its muon fields alone, without Megatron)."""
    values = dict(optimizer="muon", lr=2e-2, weight_decay=0.1, muon_momentum=0.9, muon_nesterov=True,
                  muon_num_ns_steps=5, muon_scale_mode="spectral", muon_extra_scale_factor=1.0,
                  muon_coefficient_type="quintic", muon_split_qkv=True, muon_fp32_matmul_prec="medium")
    values.update(overrides)
    if not megatron:
        return argparse.Namespace(**values)
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(**values)


def run_steps(start, grads, cfg, **attrs):
    p = torch.nn.Parameter(start.clone())
    for name, value in attrs.items():
        setattr(p, name, value)
    opt = MegatronMuon([p], **optimizer_kwargs(cfg))
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach().double()


def draw(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen), [torch.randn(*shape, generator=gen) for _ in range(3)]


# bf16 Newton-Schulz (fp32_matmul_prec 'medium', Megatron's default) is a few percent of a step off the
# float64 closed form; float32 ('high', 'low') a few parts in a million.
TOLERANCE = {"medium": 0.05, "high": 1e-4, "low": 1e-4}


@pytest.mark.parametrize("shape", [(48, 16), (16, 40)])
@pytest.mark.parametrize("kind,prec", [("simple", "medium"), ("quintic", "medium"), ("quintic", "high"),
                                       ("simple", "low")])
@pytest.mark.parametrize("mode,nesterov,extra", [("spectral", True, 1.0), ("shape_scaling", False, 1.0),
                                                 ("unit_rms_norm", True, 0.5)])
def test_steps_equal_megatrons_muon_written_out(shape, kind, prec, mode, nesterov, extra):
    start, grads = draw(shape)
    cfg = config(muon_scale_mode=mode, muon_nesterov=nesterov, muon_extra_scale_factor=extra,
                 muon_coefficient_type=kind, muon_fp32_matmul_prec=prec)
    got = run_steps(start, grads, cfg)
    want = megatron_muon_steps(start, grads, lr=cfg.lr, wd=cfg.weight_decay, mu=cfg.muon_momentum,
                               nesterov=nesterov, kind=kind, mode=mode, extra=extra)
    moved = (want - start.double()).abs().max().item()
    assert (got - want).abs().max().item() < TOLERANCE[prec] * moved


@pytest.mark.parametrize("prec", ["medium", "high"])
def test_a_qkv_weight_is_orthogonalised_per_q_k_and_v_block(prec):
    """Two query groups of [Q 16 rows, K 8, V 8] (2 heads per group, kv_channels 8), hidden 24."""
    qkv = [16, 8, 8]
    start, grads = draw((2 * sum(qkv), 24), seed=3)
    cfg = config(muon_fp32_matmul_prec=prec)
    got = run_steps(start, grads, cfg, is_qkv=True, qkv_split_shapes=qkv)
    common = dict(lr=cfg.lr, wd=cfg.weight_decay, mu=cfg.muon_momentum, nesterov=True, kind="quintic")
    want = megatron_muon_steps(start, grads, qkv=qkv, **common)
    whole = megatron_muon_steps(start, grads, **common)
    moved = (want - start.double()).abs().max().item()
    assert (got - want).abs().max().item() < TOLERANCE[prec] * moved
    assert (whole - want).abs().max().item() > 0.2 * moved  # the split is not the whole matrix
    # --muon-no-split-qkv, or a weight Megatron did not tag: the whole matrix.
    for cfg, attrs in ((config(muon_fp32_matmul_prec=prec, muon_split_qkv=False), dict(is_qkv=True,
                        qkv_split_shapes=qkv)), (cfg, {})):
        assert (run_steps(start, grads, cfg, **attrs) - whole).abs().max().item() < TOLERANCE[prec] * moved
    # Tensor parallel, blockwise: a rank holding query group 1 alone updates its rows as that group's Q, K, V.
    shard = slice(sum(qkv), 2 * sum(qkv))
    got = run_steps(start[shard], [g[shard] for g in grads], cfg, is_qkv=True, qkv_split_shapes=qkv)
    want = megatron_muon_steps(start[shard], [g[shard] for g in grads], qkv=qkv, **common)
    assert (got - want).abs().max().item() < TOLERANCE[prec] * moved


def test_coefficient_schedules_follow_megatrons_step_rules():
    from adaptor.optimizers.newton_schulz import schedule

    assert schedule("quintic", 10) == TRIPLES["quintic"] * 2
    assert schedule("simple", 3) == TRIPLES["simple"][:3]
    pe = schedule("polar_express", 10)
    assert len(pe) == 10 and pe[0] == (8.2051, -22.9019, 16.4607) and pe[7] == pe[8] == pe[9]
    assert len(schedule("aol", 8)) == 8
    for kind, steps in (("quintic", 4), ("aol", 5), ("polar_express", 7), ("custom", 5)):
        with pytest.raises(ValueError):
            schedule(kind, steps)


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
    # Megatron tags the fused QKV weight with its per-group rows: 4 heads in 2 groups of kv_channels 8.
    qkv = dict(model.named_parameters())["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.is_qkv and qkv.qkv_split_shapes == [16, 8, 8]
    assert not any(getattr(p, "is_qkv", False) for n, p in model.named_parameters() if "linear_qkv" not in n)
    # Megatron's Adam fallback of no emerging-optimizers package stays put after the build.
    import megatron.core.optimizer as m
    assert m.HAVE_EMERGING_OPTIMIZERS is False


def _args(**overrides):
    values = dict(optimizer="muon", use_distributed_optimizer=False, muon_coefficient_type="quintic",
                  muon_split_qkv=True, muon_fp32_matmul_prec="medium", muon_tp_mode="blockwise",
                  tensor_model_parallel_size=1, muon_scalar_optimizer="adam", muon_num_ns_steps=5,
                  muon_extra_scale_factor=1.0, muon_momentum=0.9, fp16=False, ckpt_format="torch_dist")
    values.update(overrides)
    return argparse.Namespace(**values)


@pytest.mark.parametrize("overrides,words", [
    ({}, None),
    ({"muon_tp_mode": "duplicated"}, None),  # one shard at TP=1: the same matrix
    ({"muon_coefficient_type": "polar_express", "muon_num_ns_steps": 8}, None),
    ({"muon_coefficient_type": "aol", "muon_num_ns_steps": 4, "muon_fp32_matmul_prec": "high"}, None),
    ({"muon_coefficient_type": "custom"}, "has no flag for its coefficients"),
    ({"muon_num_ns_steps": 4}, "must be a multiple of 5"),
    ({"muon_coefficient_type": "polar_express"}, "polar_express needs --muon-num-ns-steps >= 8"),
    ({"use_distributed_optimizer": True}, None),  # Megatron's layer-wise distributed optimizer
    ({"optimizer": "dist_muon"}, None),
    ({"muon_tp_mode": "duplicated", "tensor_model_parallel_size": 2}, "blockwise"),
    ({"muon_tp_mode": "distributed"}, "blockwise"),
    ({"muon_scalar_optimizer": "lion"}, "use adam"),
    ({"muon_num_ns_steps": 0}, "[1, 99]"),
    ({"ckpt_format": "safetensors"}, "torch_dist"),
])
def test_what_megatron_muon_cannot_give_is_one_line(overrides, words):
    why = unsupported(_args(**overrides))
    if words is None:
        assert why is None
    else:
        assert why and words in why and "\n" not in why


def test_megatrons_default_muon_flags_and_its_layer_wise_optimizer_pass():
    """Through Megatron's own parser: plain --optimizer muon (quintic, QKV split, medium) runs here, and so
    does Megatron's layer-wise distributed optimizer (--use-distributed-optimizer, or dist_muon)."""
    from megatron.training.arguments import add_megatron_arguments

    from adaptor.backend import Backend
    from adaptor.features import ArgumentError, FeatureContext
    from patches.optimizers.muon import MuonOptimizer

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    ctx = FeatureContext(backend=Backend("cpu", "gloo", "detected"), flags=argparse.Namespace())
    args = parser.parse_args(["--optimizer", "muon"])
    assert (args.muon_coefficient_type, args.muon_split_qkv, args.muon_fp32_matmul_prec) == ("quintic", True, "medium")
    MuonOptimizer().validate(args, ctx)
    MuonOptimizer().validate(parser.parse_args(["--optimizer", "muon", "--use-distributed-optimizer"]), ctx)
    MuonOptimizer().validate(parser.parse_args(["--optimizer", "dist_muon"]), ctx)
    with pytest.raises(ArgumentError, match="FSDP"):
        MuonOptimizer().validate(parser.parse_args(["--optimizer", "dist_muon", "--use-torch-fsdp2"]), ctx)


def test_a_param_group_saved_without_the_newer_keys_loads_and_steps_as_configured():
    """A muon checkpoint written before coefficient_type and the QKV split were group keys still steps."""
    start, grads = draw((16, 40))
    cfg = config()
    p = torch.nn.Parameter(start.clone())
    opt = MegatronMuon([p], **optimizer_kwargs(cfg))
    saved = opt.state_dict()
    for key in ("coefficient_type", "fp32_matmul_prec", "split_qkv", "scale_mode", "extra_scale_factor"):
        del saved["param_groups"][0][key]
    opt.load_state_dict(saved)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    assert opt.param_groups[0]["coefficient_type"] == "quintic"
    assert (p.detach().double() - run_steps(start, grads, cfg)).abs().max().item() == 0
