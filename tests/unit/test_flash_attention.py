"""--use-flash-attn: FlashAttention against megatron-core's DotProductAttention, module by module.

The module checks run in child interpreters (megatron is imported once per child, and the
adaptor's patches stay out of the pytest process): one on the CPU backend, one on the NPU
backend with the torch_npu STAND-IN (tests/npu_standin), whose ``npu_fusion_attention`` checks
its arguments and computes the reference with plain torch. Each child prints one JSON line.

Tolerances. fp32: the same sums in another order (SDPA's blocked softmax against baddbmm +
softmax), so errors stay near fp32 rounding (1e-7 relative, a few 1e-6 absolute on O(1)
values); we allow 1e-5. bf16: both modules round q·k, probabilities and outputs to bf16 (unit
roundoff 3.9e-3) at different points; 2e-2 of each tensor's largest magnitude is a few such
roundings, far below what one wrong mask element or scale causes (> 1e-1 here). Errors are
measured as max |ours - theirs| / max(1, max |theirs|), per output and per gradient.

Training with the flag (one process and TP=2): tests/e2e/test_flash_attention.py.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from helpers.npu_contract import standin_env
from helpers.paths import ROOT
from helpers.processes import run_child, tagged_json
from helpers.prefetch import prefetched

FP32_TOL = 1e-5
BF16_TOL = 2e-2

CHILD = r"""
import json, math, sys
import torch
import adaptor
from adaptor import bootstrap, run_state
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig
from adaptor.ops.flash_attention import FlashAttention

dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())  # one rank: no port to race for
ps.initialize_model_parallel(1)
model_parallel_cuda_manual_seed(1234)
# DotProductAttention allocates on the accelerator, which the NPU stand-in cannot do: the NPU
# child computes ours only; the parent compares it with the CPU child's references.
npu = run_state.backend().name == "npu"
if npu:
    import torch_npu
facts = {"backend": run_state.backend().name, "cases": {}}
saved = {}
S, B = 32, 2


def config(heads=4, groups=2, kv=32, dropout=0.0, bf16=False, scale=None):
    return TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=heads, num_query_groups=groups,
                             kv_channels=kv, attention_dropout=dropout, masked_softmax_fusion=False,
                             bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32,
                             attention_softmax_in_fp32=True, softmax_scale=scale)


def qkv(heads, groups, dk, dv, dtype=torch.float32, batch_major=False):
    g = torch.Generator().manual_seed(7)
    def t(n, d):
        if batch_major:  # [b, s, ...] storage seen as [s, b, ...]
            return torch.randn(B, S, n, d, generator=g).to(dtype).transpose(0, 1).requires_grad_()
        return torch.randn(S, B, n, d, generator=g).to(dtype).requires_grad_()
    return t(heads, dk), t(groups, dk), t(groups, dv)


def grads(module, q, k, v, mask, **kw):
    out = module(q, k, v, mask, **kw)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype)
    return [out] + list(torch.autograd.grad(out, (q, k, v), dout))


def plain(q, k, v, masked, scale):
    # fp32 reference: [s, b, n, d] in, True = masked out, out [s, b, n * dv].
    n, g = q.size(2), k.size(2)
    k = k.float().repeat_interleave(n // g, 2); v = v.float().repeat_interleave(n // g, 2)
    scores = torch.einsum("sbnd,tbnd->bnst", q.float(), k) * scale
    probs = torch.softmax(scores.masked_fill(masked, float("-inf")), -1)
    return torch.einsum("bnst,tbnd->sbnd", probs, v).reshape(q.size(0), q.size(1), -1)


def plain_grads(q, k, v, masked, scale):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = plain(q, k, v, masked, scale)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    return [out] + list(torch.autograd.grad(out, (q, k, v), dout))


def npu_calls():
    out = [c for c in torch_npu.calls if c[0] == "npu_fusion_attention"] if npu else []
    if npu:
        torch_npu.calls.clear()
    return [{"head_num": a[3], "layout": a[4], "q": list(a[0].shape), "k": list(a[1].shape), "v": list(a[2].shape),
             "sparse_mode": kw["sparse_mode"], "keep_prob": kw["keep_prob"], "scale": kw["scale"],
             "mask": None if kw["atten_mask"] is None else [list(kw["atten_mask"].shape), str(kw["atten_mask"].dtype)],
             "pre": kw["pre_tockens"], "next": kw["next_tockens"],
             "seq_q": kw["actual_seq_qlen"], "seq_kv": kw["actual_seq_kvlen"]} for _, a, kw in out]


def case(name, ours, reference):
    got = ours()
    facts["cases"][name] = {"shape": list(got[0].shape), "calls": npu_calls(),
                            "finite": all(bool(torch.isfinite(t).all()) for t in got)}
    saved[name] = {"got": [t.detach() for t in got]}
    if not npu and reference is not None:
        saved[name]["expected"] = [t.detach() for t in reference()]


causal = torch.ones(S, S, dtype=torch.bool).triu(1)
pad = torch.zeros(B, 1, S, S, dtype=torch.bool)
pad[0, :, :, 24:] = True  # batch 0: the last 8 keys are padding
pad[1, :, :, 28:] = True
pad |= causal
docs = torch.ones(S, S, dtype=torch.bool).triu(1)
docs[12:, :12] = True  # two documents in one sequence (--reset-attention-mask)

for dtype, prec in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
    for heads, groups in ((4, 4), (4, 2), (4, 1)):
        cfg = config(heads, groups, bf16=dtype == torch.bfloat16)
        for mask_name, mask_type, mask in (
            ("causal", AttnMaskType.causal, None),
            ("causal_given", AttnMaskType.causal, causal.expand(B, 1, S, S).contiguous()),
            ("padding", AttnMaskType.padding, pad),
            ("padding_causal", AttnMaskType.padding, causal[None, None]),  # a causal mask on a padding layer
            ("documents", AttnMaskType.causal, docs[None, None]),
        ):
            q, k, v = qkv(heads, groups, 32, 32, dtype)
            case(f"{prec}-{mask_name}-h{heads}g{groups}",
                 lambda: grads(FlashAttention(cfg, 1, mask_type, "self"), q, k, v, mask),
                 lambda: grads(DotProductAttention(cfg, 1, mask_type, "self"), q, k, v, mask))

# Batch-major storage: BSND on NPU.
cfg = config(4, 2)
q, k, v = qkv(4, 2, 32, 32, batch_major=True)
case("fp32-batch-major", lambda: grads(FlashAttention(cfg, 1, AttnMaskType.causal, "self"), q, k, v, None),
     lambda: grads(DotProductAttention(cfg, 1, AttnMaskType.causal, "self"), q, k, v, None))

# softmax_scale given, and apply_query_key_layer_scaling at layer 3.
cfg = config(4, 2, scale=0.05)
q, k, v = qkv(4, 2, 32, 32)
case("fp32-softmax-scale",
     lambda: grads(FlashAttention(cfg, 3, AttnMaskType.causal, "self", softmax_scale=0.05), q, k, v, None),
     lambda: grads(DotProductAttention(cfg, 3, AttnMaskType.causal, "self", softmax_scale=0.05), q, k, v, None))
cfg_ls = config(4, 2)
cfg_ls.apply_query_key_layer_scaling = True
case("fp32-qk-layer-scaling", lambda: grads(FlashAttention(cfg_ls, 3, AttnMaskType.causal, "self"), q, k, v, None),
     lambda: grads(DotProductAttention(cfg_ls, 3, AttnMaskType.causal, "self"), q, k, v, None))

# MLA: q/k head dim 48, v head dim 32, built the way MLASelfAttention builds its core attention.
for groups in (4, 2):
    cfg = config(4, groups)
    q, k, v = qkv(4, groups, 48, 32)
    case(f"fp32-mla-dv32-g{groups}",
         lambda: grads(FlashAttention(config=cfg, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                      attention_type="self", softmax_scale=None, k_channels=48, v_channels=32,
                                      cp_comm_type=None, pg_collection=None), q, k, v, None),
         lambda: plain_grads(q, k, v, causal, 1 / math.sqrt(48)))

# Packed sequences (THD, [t, heads, d]): three documents in one pack, each causal on its own.
cfg = config(4, 2)
cu = torch.tensor([0, 10, 16, 32], dtype=torch.int32)
packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=16, max_seqlen_kv=16)
g = torch.Generator().manual_seed(5)
tq, tk, tv = (torch.randn(32, n, 32, generator=g).requires_grad_() for n in (4, 2, 2))
block = torch.ones(32, 32, dtype=torch.bool)
for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
    block[a:b, a:b] = torch.ones(b - a, b - a, dtype=torch.bool).triu(1)
def thd_reference():
    out, dq, dk, dv = plain_grads(tq[:, None], tk[:, None], tv[:, None], block, 1 / math.sqrt(32))
    return [out.reshape(32, -1), dq[:, 0], dk[:, 0], dv[:, 0]]
case("fp32-thd", lambda: grads(FlashAttention(cfg, 1, AttnMaskType.causal, "self"), tq, tk, tv, None,
                               packed_seq_params=packed), thd_reference)

# Dropout: off in eval (equals DotProductAttention), on in training (changes the output).
cfg = config(4, 2, dropout=0.1)
q, k, v = qkv(4, 2, 32, 32)
def dpa_eval():
    return grads(DotProductAttention(cfg, 1, AttnMaskType.causal, "self").eval(), q, k, v, None)
case("fp32-dropout-eval", lambda: grads(FlashAttention(cfg, 1, AttnMaskType.causal, "self").eval(), q, k, v, None),
     dpa_eval)
case("fp32-dropout-train", lambda: grads(FlashAttention(cfg, 1, AttnMaskType.causal, "self").train(), q, k, v, None),
     dpa_eval)

# A query row with every key masked: zeros and finite gradients.
cfg = config(4, 2)
m = pad.clone()
m[0, :, 5, :] = True
q, k, v = qkv(4, 2, 32, 32)
case("fully-masked-row", lambda: grads(FlashAttention(cfg, 1, AttnMaskType.padding, "self"), q, k, v, m), None)

# The layer specs pick FlashAttention under --use-flash-attn (local spec, GQA and MLA).
import argparse
from adaptor.layer_specs import gpt_layer_spec
def spec_core(**kw):
    a = argparse.Namespace(num_experts=None, moe_grouped_gemm=False, qk_layernorm=True, multi_latent_attention=False,
                           normalization="RMSNorm", transformer_impl="local", use_flash_attn=True)
    vars(a).update(kw)
    return gpt_layer_spec(a, None).submodules.self_attention.submodules.core_attention.__name__
facts["spec"] = {"local": spec_core(), "mla": spec_core(multi_latent_attention=True),
                 "off": spec_core(use_flash_attn=False)}

from adaptor.features import ArgumentError
from patches.fusions.flash_attention import FlashAttentionFusion as Feature
def error(**kw):
    a = argparse.Namespace(use_flash_attn=True, transformer_impl="local", context_parallel_size=1, window_size=None)
    vars(a).update(kw)
    try:
        Feature().validate(a, run_state.context())
    except ArgumentError as exc:
        return str(exc)
facts["errors"] = {"cp2": error(context_parallel_size=2), "window": error(window_size=(64, 0)),
                   "cp2_te": error(context_parallel_size=2, transformer_impl="transformer_engine"),
                   "off": error(use_flash_attn=False, context_parallel_size=2)}
torch.save(saved, sys.argv[1])
print("FACTS" + json.dumps(facts))
"""


def _child(npu: bool, saved: Path):
    env = dict(os.environ, ADAPTOR_QUIET="1", OMP_NUM_THREADS="1")
    if npu:
        env = standin_env(env)
        env.pop("ADAPTOR_BACKEND", None)
    else:
        env["PYTHONPATH"] = str(ROOT)
        env["ADAPTOR_BACKEND"] = "cpu"
    out = run_child(CHILD, saved, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    facts = tagged_json(out.stdout)
    facts["saved"] = torch.load(saved)
    return facts


@prefetched
def children(tmp_path_factory):
    """The CPU and the NPU-stand-in child, side by side."""
    tmp = tmp_path_factory.mktemp("flash_attention")
    with ThreadPoolExecutor(2) as pool:
        cpu, npu = pool.submit(_child, False, tmp / "cpu.pt"), pool.submit(_child, True, tmp / "npu.pt")
        return {"cpu": cpu.result(), "npu": npu.result()}


def error(children, backend, name):
    """max |ours - reference| / max(1, max |reference|) over the output and dq, dk, dv."""
    got = children[backend]["saved"][name]["got"]
    expected = children["cpu"]["saved"][name]["expected"]
    assert len(got) == len(expected) == 4
    return max(((x.float() - y.float()).abs().max() / y.float().abs().max().clamp(min=1)).item()
               for x, y in zip(got, expected))


BACKENDS = ["cpu", "npu"]
MASKS = ["causal", "causal_given", "padding", "padding_causal", "documents"]
HEADS = ["h4g4", "h4g2", "h4g1"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_children_ran_on_their_backend(children, backend):
    assert children[backend]["backend"] == backend


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision,tol", [("fp32", FP32_TOL), ("bf16", BF16_TOL)])
def test_matches_dot_product_attention(children, backend, precision, tol):
    """Output and dq/dk/dv equal DotProductAttention's: MHA and GQA, causal and explicit masks."""
    for mask in MASKS:
        for heads in HEADS:
            name = f"{precision}-{mask}-{heads}"
            assert children[backend]["cases"][name]["shape"] == [32, 2, 128]
            err = error(children, backend, name)
            assert err <= tol, f"{backend} {name}: {err:.2e} > {tol}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["fp32-batch-major", "fp32-softmax-scale", "fp32-qk-layer-scaling",
                                  "fp32-mla-dv32-g4", "fp32-mla-dv32-g2", "fp32-thd", "fp32-dropout-eval"])
def test_other_configurations(children, backend, name):
    """Layouts, scales, MLA's value head dim (vs plain torch), packed THD (vs plain torch), eval dropout."""
    err = error(children, backend, name)
    assert err <= FP32_TOL, f"{backend} {name}: {err:.2e}"
    shape = children[backend]["cases"][name]["shape"]
    assert shape == ([32, 4 * 32] if name == "fp32-thd" else [32, 2, 4 * 32])  # MLA: heads x value head dim


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_in_training_and_fully_masked_rows(children, backend):
    assert error(children, backend, "fp32-dropout-train") > 1e-2
    assert children[backend]["cases"]["fp32-dropout-train"]["finite"]
    out = children[backend]["saved"]["fully-masked-row"]["got"][0]
    assert out[5, 0].abs().max().item() == 0.0 and out[6, 0].abs().max().item() > 0
    assert children[backend]["cases"]["fully-masked-row"]["finite"]


def test_the_tolerance_catches_a_wrong_scale(children):
    """The fp32 bound is far below a real mistake: a 5% scale error is visible."""
    got = children["cpu"]["saved"]["fp32-softmax-scale"]["got"]
    other = children["cpu"]["saved"]["fp32-causal-h4g2"]["expected"]  # same inputs, scale 1/sqrt(32) vs 0.05
    assert max((x - y).abs().max().item() for x, y in zip(got, other)) > 100 * FP32_TOL


def test_layer_spec_swaps_core_attention(children):
    assert children["cpu"]["spec"] == {"local": "FlashAttention", "mla": "FlashAttention",
                                       "off": "DotProductAttention"}


def test_unsupported_configurations_are_one_line_errors(children):
    errors = children["cpu"]["errors"]
    assert "--window-size" in errors["window"]
    # Context parallelism is the context_parallel feature's to check; TE's own attention, or the flag
    # off: nothing to check here.
    assert errors["cp2"] is None and errors["cp2_te"] is None and errors["off"] is None
    assert all("\n" not in e for e in errors.values() if e)


def test_cpu_path_does_not_call_torch_npu(children):
    assert all(not case["calls"] for case in children["cpu"]["cases"].values())


def test_npu_causal_call(children):
    """Causal (no mask, or Megatron's causal mask recognised): SBH, sparse_mode 2, 2048x2048 bool mask."""
    for mask in ("causal", "causal_given"):
        for heads, groups in ((4, 4), (4, 2), (4, 1)):
            calls = children["npu"]["cases"][f"fp32-{mask}-h{heads}g{groups}"]["calls"]
            assert len(calls) == 1, calls
            c = calls[0]
            assert c["layout"] == "SBH" and c["head_num"] == heads
            assert c["q"] == [32, 2, heads * 32] and c["k"] == [32, 2, groups * 32] == c["v"]  # GQA: K/V not repeated
            assert c["sparse_mode"] == 2 and c["mask"] == [[2048, 2048], "torch.bool"]
            assert c["keep_prob"] == 1.0 and c["scale"] == pytest.approx(1 / 32 ** 0.5)


def test_npu_mask_calls(children):
    """Padding and document masks: sparse_mode 0, Megatron's bool mask (True = masked) as atten_mask."""
    cases = children["npu"]["cases"]
    assert cases["fp32-padding-h4g2"]["calls"][0]["mask"] == [[2, 1, 32, 32], "torch.bool"]
    assert cases["fp32-documents-h4g2"]["calls"][0]["mask"] == [[1, 1, 32, 32], "torch.bool"]
    for name in ("fp32-padding-h4g2", "fp32-documents-h4g2"):
        c = cases[name]["calls"][0]
        assert c["sparse_mode"] == 0 and c["layout"] == "SBH"
        assert c["pre"] == c["next"] == 2147483647  # no band on top of the mask


def test_npu_layouts_scale_dropout(children):
    cases = children["npu"]["cases"]
    bsnd = cases["fp32-batch-major"]["calls"][0]
    assert bsnd["layout"] == "BSND" and bsnd["q"] == [2, 32, 4, 32] and bsnd["k"] == [2, 32, 2, 32]
    assert cases["fp32-softmax-scale"]["calls"][0]["scale"] == pytest.approx(0.05)
    # Layer scaling divides and multiplies by the layer number: the kernel gets the plain scale.
    assert cases["fp32-qk-layer-scaling"]["calls"][0]["scale"] == pytest.approx(1 / 32 ** 0.5)
    mla = cases["fp32-mla-dv32-g2"]["calls"][0]
    assert mla["q"] == [32, 2, 4 * 48] and mla["k"] == mla["v"] == [32, 2, 2 * 48]  # V padded to 48, output trimmed
    assert mla["scale"] == pytest.approx(1 / 48 ** 0.5)
    thd = cases["fp32-thd"]["calls"][0]
    assert thd["layout"] == "TND" and thd["head_num"] == 4 and thd["q"] == [32, 4, 32]
    assert thd["seq_q"] == thd["seq_kv"] == [10, 16, 32] and thd["sparse_mode"] == 3
    assert cases["fp32-dropout-eval"]["calls"][0]["keep_prob"] == 1.0
    assert cases["fp32-dropout-train"]["calls"][0]["keep_prob"] == pytest.approx(0.9)
