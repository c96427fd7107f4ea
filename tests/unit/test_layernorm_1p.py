"""--apply-layernorm-1p: every norm scales by (1 + gamma), gamma stored and starting at zero.

Against the plain norm with weight 1 + gamma, on random non-zero gamma, forward and the gradients
of x and gamma (d(1 + gamma)/d gamma = 1, so gamma's gradient is the plain weight's):

* unfused: megatron-core's ``WrappedTorchNorm`` under the feature's wrapper (RMSNorm and LayerNorm,
  with and without sequence parallelism, so both wrappers of ``__new__`` compose);
* fused: ``--use-fused-rmsnorm``'s ``FusedRMSNorm`` (the CPU/CUDA autograd function); the NPU kernel
  through the stand-in in tests/unit/test_fused_elementwise.py.

Tolerances as tests/unit/test_fused_elementwise.py: fp32 1e-5 (a few ulps of reordered sums);
bf16 2e-2 (~2.5 bf16 ulps), absolute tolerance of the token-summed gamma gradient scaled by its size.
The 1 is added in fp32: with a bf16 gamma of 1e-3 the bf16 sum 1 + gamma would be exactly 1.
"""
from __future__ import annotations

import argparse

import pytest
import torch
import torch.nn.functional as F

from adaptor import run_state
from adaptor.features import ArgumentError, FeatureContext
from adaptor.ops import rmsnorm
from adaptor.ops.zero_centered_norm import ZeroCenteredLayerNorm, ZeroCenteredRMSNorm
from adaptor.patch_manager import PatchManager
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from patches.models.layernorm_1p import Layernorm1p
from patches.upstream_fixes.sequence_parallel_torch_norm import SequenceParallelTorchNorm

H = 64
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def config(normalization="RMSNorm", **kw):
    return TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4, normalization=normalization,
                             layernorm_epsilon=1e-6, layernorm_zero_centered_gamma=True, **kw)


@pytest.fixture
def patched():
    """The feature's wrapper of WrappedTorchNorm.__new__ and the sequence-parallel one, as a run has them."""
    pm = PatchManager()
    ctx = FeatureContext(backend=run_state.backend(), flags=argparse.Namespace())
    for feature in (SequenceParallelTorchNorm(), Layernorm1p()):
        feature.register_patches(pm, ctx)
    pm.apply()
    yield
    pm.remove()


def fwd_bwd(fn, x, weight, bias=None):
    x = x.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    out = fn(x, weight) if bias is None else fn(x, weight, bias)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype))
    return out.detach(), x.grad, weight.grad


def check(got, want, dtype):
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype)
        tol = dict(TOL[dtype])
        if i == 2 and dtype != torch.float32:
            tol["atol"] *= max(1.0, b.abs().max().item())
        torch.testing.assert_close(a, b, **tol, msg=lambda m: f"tensor {i}: {m}")




def module_fwd_bwd(norm, x, gamma):
    x = x.detach().clone().requires_grad_()
    with torch.no_grad():
        norm.weight.copy_(gamma)
    norm.zero_grad()
    out = norm(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype))
    return out.detach(), x.grad, norm.weight.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normalization", ["RMSNorm", "LayerNorm"])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["", "sp"])
def test_unfused_norm_is_one_plus_gamma_times_plain(patched, dtype, normalization, sequence_parallel):
    torch.manual_seed(0)
    cfg = config(normalization, sequence_parallel=sequence_parallel, tensor_model_parallel_size=2 if
                 sequence_parallel else 1)
    norm = WrappedTorchNorm(cfg, H, eps=1e-6).to(dtype)
    assert type(norm) is {"RMSNorm": ZeroCenteredRMSNorm, "LayerNorm": ZeroCenteredLayerNorm}[normalization]
    assert cfg.layernorm_zero_centered_gamma  # hidden from upstream's assert only while building
    assert set(norm.state_dict()) == ({"weight"} if normalization == "RMSNorm" else {"weight", "bias"})
    assert torch.count_nonzero(norm.weight) == 0  # gamma starts at zero: the plain norm at weight 1
    assert all(getattr(p, "sequence_parallel", False) == sequence_parallel for p in norm.parameters())
    x = torch.randn(16, 2, H).to(dtype) * 3
    assert torch.equal(norm(x), WrappedTorchNorm(_plain_config(normalization), H, eps=1e-6).to(dtype)(x))
    gamma = (torch.randn(H) * 0.3).to(dtype)
    if normalization == "LayerNorm":
        with torch.no_grad():
            norm.bias.copy_(torch.randn(H) * 0.1)
        bias = norm.bias.detach().clone()
        plain = lambda x, w: F.layer_norm(x.float(), (H,), w.float() + 1, bias.float(), 1e-6).to(x.dtype)
    else:
        plain = lambda x, w: F.rms_norm(x.float(), (H,), w.float() + 1, 1e-6).to(x.dtype)
    check(module_fwd_bwd(norm, x, gamma), fwd_bwd(plain, x, gamma), dtype)


def _plain_config(normalization):
    return TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4, normalization=normalization,
                             layernorm_epsilon=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_rmsnorm_is_one_plus_gamma_times_plain(dtype):
    torch.manual_seed(0)
    norm = rmsnorm.FusedRMSNorm(config(), H, eps=1e-6).to(dtype)
    assert torch.count_nonzero(norm.weight) == 0 and set(norm.state_dict()) == {"weight"}
    x = torch.randn(16, 2, H).to(dtype) * 3
    torch.testing.assert_close(norm(x), torch.nn.RMSNorm(H, eps=1e-6).to(dtype)(x), **TOL[dtype])
    gamma = (torch.randn(H) * 0.3).to(dtype)
    plain = lambda x, w: F.rms_norm(x.float(), (H,), w.float() + 1, 1e-6).to(x.dtype)
    check(module_fwd_bwd(norm, x, gamma), fwd_bwd(plain, x, gamma), dtype)
    # the zero-centred unfused norm and the fused one agree on the same stored gamma
    unfused = ZeroCenteredRMSNorm(H, eps=1e-6).to(dtype)
    unfused.load_state_dict(norm.state_dict())
    torch.testing.assert_close(norm(x), unfused(x), **TOL[dtype])


def test_bf16_gamma_smaller_than_a_bf16_step_still_scales():
    norm = rmsnorm.FusedRMSNorm(config(), H, eps=1e-6).bfloat16()
    unfused = ZeroCenteredRMSNorm(H, eps=1e-6).bfloat16()
    x = torch.randn(4, H).bfloat16()
    for module in (norm, unfused):
        before = module(x).float()
        with torch.no_grad():
            module.weight.fill_(3e-3)  # 1 + 3e-3 rounds to 1 in bf16
        ratio = (module(x).float() / before).mean().item()
        assert ratio == pytest.approx(1.003, abs=5e-4), (type(module).__name__, ratio)


def test_only_layernorm_and_rmsnorm():
    args = argparse.Namespace(normalization="L2Norm")
    with pytest.raises(ArgumentError, match="needs --normalization LayerNorm or RMSNorm"):
        Layernorm1p().validate(args, None)


def test_hugging_face_families_refuse_a_zero_centred_gamma():
    """The converted families (Qwen3, DeepSeek-V3, Llama, Qwen2) scale by weight: --hf-load-dir, --hf-save-dir, a converted --load and
    tools/safetensors_ckpt.py merge all stop on the same line instead of reading gamma as the scale."""
    from adaptor.convert.config_check import ZERO_CENTRED_GAMMA, config_mismatch
    from adaptor.convert.online import hf_config_from_args

    args = argparse.Namespace(layernorm_zero_centered_gamma=True, model_type_hf="qwen3")
    assert config_mismatch(args, ["--num-layers", "4"]) == ZERO_CENTRED_GAMMA
    with pytest.raises(ValueError, match="--apply-layernorm-1p is on, but the norms of the Hugging Face families converted here scale by"):
        hf_config_from_args(args)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_transformers_gemma_rmsnorm(patched, dtype):
    """Hugging Face's GemmaRMSNorm (weight zeros, scale 1 + weight in fp32, one rounding) is the same
    module: the same state dict loads into it, outputs and gradients agree, fused and unfused."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    torch.manual_seed(0)
    gemma = GemmaRMSNorm(H, eps=1e-6).to(dtype)
    gamma = (torch.randn(H) * 0.3).to(dtype)
    x = torch.randn(16, 2, H).to(dtype) * 3
    want = module_fwd_bwd(gemma, x, gamma)
    for ours in (WrappedTorchNorm(config(), H, eps=1e-6), rmsnorm.FusedRMSNorm(config(), H, eps=1e-6)):
        ours = ours.to(dtype)
        assert set(ours.state_dict()) == set(gemma.state_dict()) == {"weight"}
        assert torch.equal(ours.weight, torch.zeros(H, dtype=dtype))  # same initialisation
        check(module_fwd_bwd(ours, x, gamma), want, dtype)
