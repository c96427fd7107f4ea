"""--use-fused-rmsnorm, --use-fused-swiglu, --use-fused-rotary-pos-emb against megatron-core's unfused code.

Each op's forward and backward is compared with the module or function that
megatron-core runs without the flag, on the same inputs:

* fp32: max |fused - unfused| <= 1e-5 + 1e-5 * |unfused| (assert_close with
  rtol=atol=1e-5). The fused code computes the same formula in a different
  order, so differences are a few fp32 ulps (~1e-7 relative); a wrong sign,
  half or epsilon is off by >= 1e-3.
* bf16: rtol=atol=2e-2, about 2.5 bf16 ulps (2^-7 = 7.8e-3): the fused code
  rounds once where the unfused one rounds after every elementwise op.

The NPU path runs in a subprocess against the torch_npu STAND-IN
(tests/npu_standin), which checks every call's arguments and returns plain
torch reference results. A pretrain_gpt.py run with all three flags against the
run without them: tests/e2e/test_fused_elementwise.py.
"""
from __future__ import annotations

import argparse
import functools

import pytest
import torch
import torch.nn.functional as F


from adaptor import run_state
from adaptor.features import ArgumentError, FeatureContext
from adaptor.ops import rmsnorm, rope, swiglu
from adaptor.patch_manager import PatchManager
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from patches.fusions.rmsnorm import RmsNormFusion
from patches.fusions.rope import RopeFusion
from patches.fusions.swiglu import SwigluFusion
from helpers.npu_contract import standin_env
from helpers.processes import run_child, tagged_json
from helpers.prefetch import prefetched

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
DTYPES = [torch.float32, torch.bfloat16]


def config(**kw):
    base = dict(num_layers=1, hidden_size=64, num_attention_heads=4, normalization="RMSNorm", layernorm_epsilon=1e-6)
    return TransformerConfig(**{**base, **kw})


def fwd_bwd(fn, *inputs, grad_seed=1):
    """Output and input grads of fn(*inputs) under a fixed random output gradient."""
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*inputs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(out.dtype)
    out.backward(g)
    return [out.detach()] + [t.grad for t in inputs if t.requires_grad]


def assert_all_close(got, want, dtype, sums=()):
    """``sums``: indices of gradients summed over tokens (weight, bias); in bf16 their absolute
    tolerance scales with the largest entry, since a sum of rounded terms cancels."""
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype, a.shape, b.shape)
        tol = dict(TOL[dtype])
        if i in sums and dtype != torch.float32:
            tol["atol"] *= max(1.0, b.abs().max().item())
        torch.testing.assert_close(a, b, **tol, msg=lambda m: f"tensor {i}: {m}")


# ----------------------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16, 2, 64), (16, 2, 4, 32)], ids=["hidden", "qk_layernorm"])
def test_rmsnorm_matches_wrapped_torch_norm(dtype, shape):
    torch.manual_seed(0)
    h = shape[-1]
    ours = rmsnorm.FusedRMSNorm(config(), h, eps=1e-6).to(dtype)
    upstream = WrappedTorchNorm(config(), h, eps=1e-6).to(dtype)
    assert isinstance(upstream, torch.nn.RMSNorm)
    assert ours.state_dict().keys() == upstream.state_dict().keys() == {"weight"}
    assert torch.equal(ours.weight, upstream.weight)  # same initialisation
    weight = torch.randn(h).to(dtype) * 0.5 + 1
    x = torch.randn(shape).to(dtype) * 3
    got = fwd_bwd(lambda x, w: rmsnorm.rms_norm(x, w, 1e-6), x, weight)
    want = fwd_bwd(lambda x, w: F.rms_norm(x, (h,), w, 1e-6), x, weight)
    assert_all_close(got, want, dtype, sums=(2,))
    upstream.load_state_dict(ours.state_dict())  # checkpoints load either way
    torch.testing.assert_close(ours(x), upstream(x), **TOL[dtype])


def test_rmsnorm_layernorm_falls_back_to_upstream():
    norm = rmsnorm.FusedRMSNorm(config(normalization="LayerNorm"), 64, eps=1e-5)
    assert type(norm) is torch.nn.LayerNorm and norm.eps == 1e-5


def test_layer_spec_uses_fused_rmsnorm_everywhere(cpu_training_process):
    from adaptor.layer_specs import gpt_layer_spec

    args = argparse.Namespace(transformer_impl="local", num_experts=None, moe_grouped_gemm=False, qk_layernorm=True,
                              multi_latent_attention=False, normalization="RMSNorm", use_fused_rmsnorm=True,
                              use_flash_attn=False)
    sub = gpt_layer_spec(args, config()).submodules
    attn = sub.self_attention.submodules
    for module in (sub.input_layernorm, sub.pre_mlp_layernorm, attn.q_layernorm, attn.k_layernorm):
        assert module is rmsnorm.FusedRMSNorm, module
    args.use_fused_rmsnorm = False
    assert gpt_layer_spec(args, config()).submodules.input_layernorm is WrappedTorchNorm


# ----------------------------------------------------------------------------- SwiGLU
def unfused_glu(x):  # MLP.forward's path without bias_activation_fusion
    a, b = torch.chunk(x, 2, dim=-1)
    return F.silu(a) * b


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_matches_unfused(dtype):
    torch.manual_seed(0)
    x = torch.randn(32, 2, 96).to(dtype) * 3
    bias = torch.randn(96).to(dtype)
    assert_all_close(fwd_bwd(lambda x: swiglu.bias_swiglu_impl(x, None), x), fwd_bwd(unfused_glu, x), dtype)
    assert_all_close(fwd_bwd(lambda x, b: swiglu.bias_swiglu_impl(x, b), x, bias),
                     fwd_bwd(lambda x, b: unfused_glu(x + b), x, bias), dtype, sums=(2,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_weighted_swiglu_matches_unfused(dtype):
    torch.manual_seed(0)
    x = torch.randn(40, 64).to(dtype)
    w = torch.rand(40, 1)  # router probabilities stay fp32 upstream
    got = fwd_bwd(lambda x, w: swiglu.weighted_bias_swiglu_impl(x, None, w), x, w)
    want = fwd_bwd(lambda x, w: (unfused_glu(x) * w).to(dtype), x, w)
    assert_all_close(got, want, dtype, sums=(2,))


# ----------------------------------------------------------------------------- RoPE
def rope_freqs(seq, dim, base=1e6):
    """As megatron-core's RotaryEmbedding builds them: [seq, 1, 1, dim], halves repeated."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    f = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return torch.cat((f, f), dim=-1)[:, None, None, :]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_percent", [1.0, 0.5])
@pytest.mark.parametrize("angles", ["rope", "random"])
def test_rope_matches_unfused_bshd(dtype, rotary_percent, angles):
    """'random' angles differ between the two halves, so each half's cos/sin must be the right one."""
    torch.manual_seed(0)
    t = torch.randn(24, 2, 4, 32).to(dtype)
    dim = int(32 * rotary_percent)
    freqs = rope_freqs(24, dim) if angles == "rope" else torch.rand(24, 1, 1, dim) * 6
    got = fwd_bwd(lambda t: rope.fused_apply_rotary_pos_emb(t, freqs), t)
    want = fwd_bwd(lambda t: rope_utils._apply_rotary_pos_emb_bshd(t, freqs), t)
    assert_all_close(got, want, dtype)
    with pytest.raises(NotImplementedError, match="non-interleaved"):
        rope.fused_apply_rotary_pos_emb(t, freqs, interleaved=True)


@pytest.fixture(scope="module")
def single_rank_group():
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if created:
        dist.destroy_process_group()


@pytest.mark.parametrize("packed_freqs", [False, True], ids=["max_seq_freqs", "per_token_freqs"])
def test_rope_matches_unfused_thd_through_megatron_dispatch(single_rank_group, packed_freqs):
    """apply_rotary_pos_emb with apply_rope_fusion reaches ours (patched) and equals the unfused THD path."""
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    t = torch.randn(20, 4, 32)
    freqs = rope_freqs(20 if packed_freqs else 16, 32)
    pm = PatchManager()
    RopeFusion().register_patches(pm, FeatureContext(backend=run_state.backend(), flags=argparse.Namespace()))
    pm.apply()
    try:
        fused_cfg = config(apply_rope_fusion=True)  # upstream refuses this without TE unless patched
        got = fwd_bwd(lambda t: rope_utils.apply_rotary_pos_emb(t, freqs, fused_cfg, cu_seqlens=cu,
                                                                cp_group=single_rank_group), t)
        got_bshd = rope_utils.apply_rotary_pos_emb(t[:16, None], rope_freqs(16, 32), fused_cfg, cp_group=single_rank_group)
    finally:
        pm.remove()
    assert rope_utils.fused_apply_rotary_pos_emb is None  # removed again
    want = fwd_bwd(lambda t: rope_utils.apply_rotary_pos_emb(t, freqs, config(), cu_seqlens=cu,
                                                             cp_group=single_rank_group), t)
    assert_all_close(got, want, torch.float32)
    torch.testing.assert_close(got_bshd, rope_utils._apply_rotary_pos_emb_bshd(t[:16, None], rope_freqs(16, 32)),
                               **TOL[torch.float32])


# ----------------------------------------------------------------------------- arguments
@functools.lru_cache(maxsize=1)
def megatron_parser():
    from megatron.training import arguments as margs

    parser = margs.add_megatron_arguments(argparse.ArgumentParser())
    for feature in (RmsNormFusion(), SwigluFusion(), RopeFusion()):
        feature.add_arguments(parser)
    return parser


def run_checks(feature, argv):
    """Megatron's parser, the cpu backend defaults, then the feature's defaults and checks."""
    from adaptor.features import explicit_dests

    parser = megatron_parser()
    args = parser.parse_args(list(argv))
    ctx = FeatureContext(backend=run_state.backend(), flags=args, explicit=explicit_dests(parser, argv))
    for dest in ("bias_swiglu_fusion", "apply_rope_fusion"):  # what backend_defaults sets off CUDA
        if dest not in ctx.explicit:
            setattr(args, dest, False)
    feature.set_defaults(args, ctx)
    feature.validate(args, ctx)
    return args


def test_flags_turn_upstream_fusions_on_and_check_arguments():
    args = run_checks(SwigluFusion(), ["--swiglu", "--use-fused-swiglu"])
    assert args.bias_swiglu_fusion is True
    args = run_checks(RopeFusion(), ["--position-embedding-type", "rope", "--use-fused-rotary-pos-emb"])
    assert args.apply_rope_fusion is True
    bad = [
        (SwigluFusion(), ["--use-fused-swiglu"], "needs --swiglu"),
        (SwigluFusion(), ["--swiglu", "--no-bias-swiglu-fusion", "--use-fused-swiglu"], "contradict"),
        (RopeFusion(), ["--position-embedding-type", "learned_absolute", "--use-fused-rotary-pos-emb"], "needs --position"),
        (RopeFusion(), ["--position-embedding-type", "rope", "--no-rope-fusion", "--use-fused-rotary-pos-emb"], "contradict"),
        (RopeFusion(), ["--position-embedding-type", "rope", "--rotary-interleaved", "--use-fused-rotary-pos-emb"],
         "non-interleaved"),
    ]
    for feature, argv, message in bad:
        with pytest.raises(ArgumentError, match=message):
            run_checks(feature, argv)


# ----------------------------------------------------------------------------- NPU (stand-in)
NPU_CHILD = r"""
import json, sys, torch
import torch.nn.functional as F
import torch_npu
sys.argv = ["pretrain_gpt.py", "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb"]
import adaptor
from adaptor import bootstrap, run_state
from adaptor.ops import rmsnorm, rope, swiglu
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.transformer import mlp
from megatron.core.transformer.moe import experts

facts = {"backend": run_state.backend().name, "features": [f.name for f in run_state.registry().enabled(run_state.context())],
         "patched": [mlp.bias_swiglu_impl is swiglu.bias_swiglu_impl,
                     experts.weighted_bias_swiglu_impl is swiglu.weighted_bias_swiglu_impl,
                     rope_utils.fused_apply_rotary_pos_emb is rope.fused_apply_rotary_pos_emb,
                     rope_utils.fused_apply_rotary_pos_emb_thd is rope.fused_apply_rotary_pos_emb_thd]}
gen = torch.Generator().manual_seed(0)
diffs = {}

def check(name, fused, reference, *inputs):
    outs = []
    for fn in (fused, reference):
        xs = [t.clone().requires_grad_() for t in inputs]
        y = fn(*xs)
        y.backward(torch.ones_like(y) * 0.5 + torch.arange(y.numel()).reshape(y.shape) % 3)
        outs.append([y.detach()] + [t.grad for t in xs])
    diffs[name] = max((a - b).abs().max().item() for a, b in zip(*outs))

torch_npu.calls.clear()
x, w = torch.randn(8, 2, 64, generator=gen), torch.rand(64, generator=gen) + 0.5
check("rms_norm", lambda x, w: rmsnorm.rms_norm(x, w, 1e-6),
      lambda x, w: F.rms_norm(x, (64,), w, 1e-6), x, w)
y = torch.randn(8, 2, 96, generator=gen)
check("swiglu", lambda y: mlp.bias_swiglu_impl(y, None), lambda y: F.silu(y[..., :48]) * y[..., 48:], y)
check("weighted_swiglu", lambda y: experts.weighted_bias_swiglu_impl(y, None, torch.full((16, 1), 0.25)),
      lambda y: F.silu(y[..., :48]) * y[..., 48:] * 0.25, y.reshape(16, 96))
t = torch.randn(16, 2, 4, 32, generator=gen)
freqs = torch.rand(16, 1, 1, 16, generator=gen) * 6
check("rope_bshd_half_rotary", lambda t: rope_utils.fused_apply_rotary_pos_emb(t, freqs),
      lambda t: rope_utils._apply_rotary_pos_emb_bshd(t, freqs), t)
cu = torch.tensor([0, 6, 16], dtype=torch.int32)
freqs32 = torch.rand(10, 1, 1, 32, generator=gen) * 6
thd_ref = lambda t: torch.cat([rope_utils._apply_rotary_pos_emb_bshd(t[:6, None], freqs32[:6]),
                               rope_utils._apply_rotary_pos_emb_bshd(t[6:, None], freqs32[:10])])[:, 0]
check("rope_thd", lambda t: rope_utils.fused_apply_rotary_pos_emb_thd(t, cu, freqs32), thd_ref, t[:, 0])
# --apply-layernorm-1p: the kernel takes 1 + gamma as an fp32 gamma (a pair it accepts with any x).
check("rms_norm_1p", lambda x, w: rmsnorm.rms_norm(x, w, 1e-6, zero_centered=True),
      lambda x, w: F.rms_norm(x, (64,), w + 1, 1e-6), x, w - 1)
rmsnorm.rms_norm(x.bfloat16(), (w - 1).bfloat16(), 1e-6, zero_centered=True)
facts["calls"] = [[n, [list(a.shape) if isinstance(a, torch.Tensor) else repr(a) for a in args],
                   {k: repr(v) for k, v in kw.items()}] for n, args, kw in torch_npu.calls]
facts["diffs"] = diffs
rejected = []
for bad in (lambda: torch_npu.npu_rotary_mul(torch.randn(4, 2, 8), torch.randn(4, 1, 8), torch.randn(4, 1, 8)),
            lambda: torch_npu.npu_rotary_mul(t, torch.randn(16, 1, 1, 16), torch.randn(16, 1, 1, 16)),
            lambda: torch_npu.npu_swiglu(torch.randn(4, 5)),
            lambda: torch_npu.npu_rms_norm(x, torch.ones(32), epsilon=1e-6)):
    try:
        bad()
    except RuntimeError as exc:
        rejected.append(str(exc))
facts["rejected"] = rejected
print("FACTS" + json.dumps(facts))
"""


@prefetched
def npu_child():
    env = standin_env(ADAPTOR_QUIET="1")
    env.pop("ADAPTOR_BACKEND", None)
    out = run_child(NPU_CHILD, env=env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return tagged_json(out.stdout)


def test_npu_path_calls_torch_npu_kernels_with_documented_arguments(npu_child):
    facts = npu_child
    assert facts["backend"] == "npu"
    assert {"rmsnorm", "swiglu", "rope"} <= set(facts["features"])
    assert facts["patched"] == [True, True, True, True]  # names imported by mlp.py / experts.py rebound
    calls = facts["calls"]
    # Forward calls only: backward runs through the kernels' own autograd (here: plain torch).
    assert calls[0] == ["npu_rms_norm", [[8, 2, 64], [64]], {"epsilon": "1e-06"}]
    assert calls[1] == ["npu_swiglu", [[8, 2, 96]], {"dim": "-1"}]
    assert calls[2] == ["npu_swiglu", [[16, 96]], {"dim": "-1"}]
    # SBND input, S11D cos/sin, only the rotary part (rotary_percent 0.5: 16 of 32 channels).
    assert calls[3] == ["npu_rotary_mul", [[16, 2, 4, 16], [16, 1, 1, 16], [16, 1, 1, 16]], {"rotary_mode": "'half'", "rotate": "None"}]
    # Packed sequences: T1ND input with per-token angles.
    assert calls[4] == ["npu_rotary_mul", [[16, 1, 4, 32], [16, 1, 1, 32], [16, 1, 1, 32]], {"rotary_mode": "'half'", "rotate": "None"}]
    assert calls[5] == ["npu_rms_norm", [[8, 2, 64], [64]], {"epsilon": "1e-06"}]  # zero-centred, fp32 x
    assert calls[6] == ["npu_rms_norm", [[8, 2, 64], [64]], {"epsilon": "1e-06"}]  # bf16 x, fp32 1 + gamma
    assert len(calls) == 7, calls  # the references are plain torch
    for name, diff in facts["diffs"].items():
        assert diff <= 1e-5, (name, diff)
    assert len(facts["rejected"]) == 4, facts["rejected"]  # the stand-in refuses malformed calls
