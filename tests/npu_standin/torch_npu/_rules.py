"""Documented rules of the torch_npu operators that neither the schema file nor the meta file holds.

Each rule takes the call's bound arguments (schema names, defaults filled in) and returns None or
one line saying what a device would refuse. The comment above each group names its source:

* OP-PLUGIN: the operator's page under ``docs/context/`` of the Ascend/op-plugin repository
  (torch_npu's operator reference, e.g. ``torch_npu-npu_fusion_attention.md``);
* PTA-7.0.0: the "torch_npu" API reference of Ascend Extension for PyTorch 7.0.0 on hiascend.com
  (``Pytorch/700/apiref/apilist/ptaoplist_000880.html`` for ``npu_grouped_matmul``);
* OPS-ADV: the kernel's aclnn page under ``docs/`` of Ascend's cann-ops-adv repository
  (``FlashAttentionScoreGrad.md``, which torch_npu's ``npu_fusion_attention_grad`` runs);
* OP-PLUGIN-SRC: op-plugin's own code (``op_plugin/ops/opapi/FlashAttentionKernelNpuOpApi.cpp``,
  and the autograd formula that feeds the forward's outputs to the backward).

The stand-in models an Atlas A2 training device (SoC Ascend910B1), so where a page gives a table
per product the A2 row applies. Where the documentation leaves a result undefined (attention rows
with every key masked), the reference makes it NaN instead of refusing the call (``_reference``).
Rules we could not find written down are not invented: no batch or sequence limit is checked
beyond those the attention page states.
"""
from __future__ import annotations

import torch

LOW = (torch.float16, torch.bfloat16)
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _dtype(name, allowed):
    def rule(a):
        t = a[name]
        if t is not None and t.dtype not in allowed:
            return f"{name} is {t.dtype}; the kernel takes {', '.join(str(d) for d in allowed)}"

    return rule


def _same_dtype(name, other):
    def rule(a):
        if a[name] is not None and a[name].dtype != a[other].dtype:
            return f"{name} is {a[name].dtype} but {other} is {a[other].dtype}; they must match"

    return rule


def _check(predicate, message):
    def rule(a):
        if not predicate(a):
            return message(a) if callable(message) else message

    return rule


# OP-PLUGIN torch_npu.npu_rms_norm page: self fp16/bf16/fp32; gamma's shape is self's last dims;
# on Atlas A2/A3 the (self, gamma) dtype pairs are (fp16, fp16), (bf16, bf16), (fp32, fp32),
# (fp16, fp32) and (bf16, fp32): fp32 activations never take a low-precision gamma.
RMS_NORM_PAIRS = {(torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                  (torch.float16, torch.float32), (torch.bfloat16, torch.float32)}
RMS_NORM = (
    _dtype("self", FLOATS),
    _check(lambda a: (a["self"].dtype, a["gamma"].dtype) in RMS_NORM_PAIRS,
           lambda a: f"gamma is {a['gamma'].dtype} with self {a['self'].dtype}: not a dtype pair the kernel takes"),
    _check(lambda a: a["gamma"].dim() >= 1 and tuple(a["self"].shape[-a["gamma"].dim():]) == tuple(a["gamma"].shape),
           lambda a: f"gamma {tuple(a['gamma'].shape)} must equal the last dims of x {tuple(a['self'].shape)}"),
)

# npu_swiglu splits ``dim`` into the two halves a and b (torch_npu's meta function halves it):
# the dim must be even. Float dtypes as the other elementwise kernels.
SWIGLU = (
    _dtype("self", FLOATS),
    _check(lambda a: a["self"].shape[a["dim"]] % 2 == 0,
           lambda a: f"x.shape[{a['dim']}] = {a['self'].shape[a['dim']]} must be even"),
)

# OP-PLUGIN: on Atlas A2/A3 rotary_mode is 'half' or 'interleave' (op-plugin's graph converter for
# npu_rotary_mul); x, r1 and r2 share one 4-D layout, r1 and r2 the same shape, whose B/N dims may
# be 1 (its DTensor sharding rule); D is not split.
ROTARY_MUL = (
    _dtype("self", FLOATS),
    _same_dtype("r1", "self"),
    _same_dtype("r2", "self"),
    _check(lambda a: a["rotary_mode"] in ("half", "interleave"), lambda a: f"rotary_mode {a['rotary_mode']!r}"),
    _check(lambda a: all(a[n].dim() == 4 for n in ("self", "r1", "r2")),
           lambda a: f"x, r1, r2 must be 4-D, got {a['self'].dim()}, {a['r1'].dim()}, {a['r2'].dim()}"),
    _check(lambda a: a["self"].shape[-1] % 2 == 0, lambda a: f"D = {a['self'].shape[-1]} must be even"),
    _check(lambda a: a["r1"].shape == a["r2"].shape and a["r1"].shape[-1] == a["self"].shape[-1]
           and all(r in (1, n) for r, n in zip(a["r1"].shape[:3], a["self"].shape[:3])),
           lambda a: f"r1/r2 {tuple(a['r1'].shape)} do not broadcast to x {tuple(a['self'].shape)}"),
)

# OP-PLUGIN docs/context/torch_npu-npu_fusion_attention.md: query, key, value (and pse) of one
# dtype, fp16/bf16/fp32; key and value of one shape; Dq = Dk >= Dv, D in 1..768; Nq in 1..256 and a
# multiple of Nkv; B in 1..2M (TND: 1..2K); atten_mask bool or uint8 (1 = masked) shaped BNSS,
# B1SS, 11SS or SS (TND: SS only), and under TND no row of it fully masked; sparse_mode 0..8, where
# 2/3/4 take the 2048x2048 compressed mask here, 5 is not for TND and 7/8 are TND only;
# actual_seq_qlen/kvlen are cumulative lengths ending at T (trailing zeros leave batches out).
LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
COMPRESSED = 2048


def _heads_and_dims(a):
    """(n1, n2, d_qk, d_v) of the call."""
    q, k, v, n1, layout = a["query"], a["key"], a["value"], a["head_num"], a["input_layout"]
    if layout in ("BSH", "SBH"):
        d = q.size(2) // n1
        return n1, k.size(2) // d, d, v.size(2) // (k.size(2) // d)
    head_dim = {"BSND": 2, "BNSD": 1, "TND": 1}[layout]
    return q.size(head_dim), k.size(head_dim), q.size(-1), v.size(-1)


def _batch(a):
    q, layout = a["query"], a["input_layout"]
    if layout == "TND":
        return len([x for x in a["actual_seq_qlen"] or [] if x])
    return q.size(1) if layout == "SBH" else q.size(0)


def _attention_mask_problem(a):
    mode, mask, tnd = a["sparse_mode"], a["atten_mask"], a["input_layout"] == "TND"
    if mode not in range(9):
        return f"sparse_mode {mode} is not one of 0..8"
    if mode in (7, 8) and not tnd:
        return f"sparse_mode {mode} is for the TND layout only"
    if mode == 5 and tnd:
        return "sparse_mode 5 is not for the TND layout"
    if mode in (2, 3, 4):
        if mask is None or tuple(mask.shape) != (COMPRESSED, COMPRESSED) or mask.dtype != torch.bool:
            return f"sparse_mode {mode} takes the {COMPRESSED}x{COMPRESSED} bool compressed mask"
        if not torch.equal(mask, torch.ones(COMPRESSED, COMPRESSED, dtype=torch.bool).triu(1)):
            return "the compressed mask must be the upper triangle above the diagonal (True = masked)"
    if mode == 1 and mask is None:
        return "sparse_mode 1 needs the full atten_mask"
    if mask is not None and mode in (0, 1):
        if mask.dtype not in (torch.bool, torch.uint8):
            return f"atten_mask is {mask.dtype}; it must be bool or uint8 (1 = masked)"
        if mask.dim() not in ((2,) if tnd else (2, 4)):
            return f"atten_mask must be {'SS' if tnd else 'SS, B1SS, BNSS or 11SS'}, got {tuple(mask.shape)}"
        if tnd and bool(mask.bool().all(-1).any()):
            return "under TND no row of atten_mask may be fully masked"


def _tnd_problem(a):
    qlen, kvlen = a["actual_seq_qlen"], a["actual_seq_kvlen"]
    if a["input_layout"] != "TND":
        if qlen is not None or kvlen is not None:
            return "actual_seq_qlen/actual_seq_kvlen are for the TND layout only"
        return None
    if qlen is None or kvlen is None:
        return "TND needs actual_seq_qlen and actual_seq_kvlen"
    if len(qlen) != len(kvlen):
        return f"actual_seq_qlen has {len(qlen)} entries, actual_seq_kvlen {len(kvlen)}"
    for name, seq, total in (("actual_seq_qlen", qlen, a["query"].size(0)), ("actual_seq_kvlen", kvlen, a["key"].size(0))):
        used = list(seq)
        while used and used[-1] == 0:
            used.pop()
        if not used or any(y < x for x, y in zip([0] + used, used)) or used[-1] != total:
            return f"{name} must be cumulative (non-decreasing) and end at T = {total}, got {list(seq)}"


FUSION_ATTENTION = (
    _check(lambda a: a["input_layout"] in LAYOUTS, lambda a: f"input_layout {a['input_layout']!r} not in {LAYOUTS}"),
    _dtype("query", FLOATS),
    _same_dtype("key", "query"),
    _same_dtype("value", "query"),
    _check(lambda a: all(a[n].dim() == (3 if a["input_layout"] in ("BSH", "SBH", "TND") else 4)
                         for n in ("query", "key", "value")),
           lambda a: f"{a['input_layout']} takes {3 if a['input_layout'] in ('BSH', 'SBH', 'TND') else 4}-D q/k/v"),
    _check(lambda a: a["key"].shape == a["value"].shape,
           lambda a: f"key {tuple(a['key'].shape)} and value {tuple(a['value'].shape)} must have one shape"),
    _check(lambda a: _heads_and_dims(a)[0] == a["head_num"] or a["input_layout"] in ("BSH", "SBH"),
           lambda a: f"head_num {a['head_num']} is not the query's head count {_heads_and_dims(a)[0]}"),
    _check(lambda a: 1 <= a["head_num"] <= 256, lambda a: f"head_num {a['head_num']} must be 1..256"),
    _check(lambda a: _heads_and_dims(a)[1] > 0 and _heads_and_dims(a)[0] % _heads_and_dims(a)[1] == 0,
           lambda a: "query heads {} are not a multiple of key/value heads {}".format(*_heads_and_dims(a)[:2])),
    _check(lambda a: 1 <= _heads_and_dims(a)[2] <= 768,
           lambda a: f"head dim {_heads_and_dims(a)[2]} must be 1..768"),
    _check(lambda a: 1 <= _batch(a) <= (2048 if a["input_layout"] == "TND" else 2 * 1024 * 1024),
           lambda a: f"batch {_batch(a)} out of range for {a['input_layout']}"),
    _check(lambda a: 0.0 < a["keep_prob"] <= 1.0, lambda a: f"keep_prob {a['keep_prob']} must be in (0, 1]"),
    _check(lambda a: a["pse"] is None and a["padding_mask"] is None and a["prefix"] is None and a["sink"] is None,
           "pse, padding_mask, prefix and sink are not modelled by the stand-in"),
    # OP-PLUGIN (same page), softmax_layout: only "TND", only with input_layout TND; "" keeps the
    # default NTD order of the TND softmax outputs.
    _check(lambda a: a["softmax_layout"] == "" or (a["softmax_layout"] == "TND" and a["input_layout"] == "TND"),
           lambda a: f"softmax_layout {a['softmax_layout']!r} with input_layout {a['input_layout']}: "
                     "only 'TND' with the TND layout"),
    _attention_mask_problem,
    _tnd_problem,
)


# npu_fusion_attention_grad. OPS-ADV FlashAttentionScoreGrad.md: softmaxMax and softmaxSum are the
# forward's intermediate outputs, float32, [B, N, S, 8] ([T, N, 8] for TND); softmaxIn is reserved
# and passed empty; attentionIn is the forward's final output, dtype (and, with equal head dims,
# shape) of query, as is dy; the kernel rebuilds the softmax from softmaxMax/Sum and uses
# rowsum(dy * attentionIn), so it cannot run without them. OP-PLUGIN-SRC: torch_npu's autograd for
# npu_fusion_attention passes the forward's (softmax_max, softmax_sum, softmax_out, output) as
# (softmax_max, softmax_sum, softmax_in, attention_in), softmax_out being the empty [0] tensor; with
# keep_prob < 1 the kernel regenerates the forward's dropout mask from seed/offset/numels, which the
# stand-in cannot (its forward draws torch's own dropout), so the backward is refused there.
def _attention_out_shape(a):
    """The forward's output shape: query's, with the value head dim."""
    q, (n1, _, _, dv) = a["query"], _heads_and_dims(a)
    if a["input_layout"] in ("BSH", "SBH"):
        return (q.size(0), q.size(1), n1 * dv)
    return tuple(q.shape[:-1]) + (dv,)


def _softmax_stats_shape(a):
    """softmax_max/softmax_sum as the forward's meta function gives them."""
    q, layout, n = a["query"], a["input_layout"], a["head_num"]
    if layout == "TND":
        return (q.size(0), n, 8)
    batch, seq = {"BSH": (0, 1), "SBH": (1, 0), "BSND": (0, 1), "BNSD": (0, 2)}[layout]
    return (q.size(batch), n, q.size(seq), 8)


def _grad_inputs_problem(a):
    missing = [n for n in ("softmax_max", "softmax_sum", "attention_in") if a[n] is None]
    if missing:
        return (f"{', '.join(missing)} missing: the backward kernel rebuilds the softmax from the forward's "
                "softmax_max/softmax_sum and needs its output as attention_in")
    for name in ("softmax_max", "softmax_sum"):
        t = a[name]
        if t.dtype != torch.float32 or tuple(t.shape) != _softmax_stats_shape(a):
            return (f"{name} is {tuple(t.shape)} {t.dtype}; the forward gives {_softmax_stats_shape(a)} "
                    "torch.float32")
    for name in ("dy", "attention_in"):
        t = a[name]
        if t.dtype != a["query"].dtype or tuple(t.shape) != _attention_out_shape(a):
            return (f"{name} is {tuple(t.shape)} {t.dtype}; the forward's output is {_attention_out_shape(a)} "
                    f"{a['query'].dtype}")
    if a["softmax_in"] is not None and a["softmax_in"].numel():
        return "softmax_in is reserved: pass None or the forward's empty softmax_out"


FUSION_ATTENTION_GRAD = FUSION_ATTENTION + (
    _grad_inputs_problem,
    _check(lambda a: a["keep_prob"] == 1.0,
           lambda a: f"keep_prob {a['keep_prob']}: the backward's dropout (regenerated from seed/offset) "
                     "is not modelled by the stand-in"),
)


# PTA-7.0.0 torch_npu.npu_grouped_matmul: x/weight/y fp16, bf16 or fp32, where fp32 holds "only
# when x, weight and y are all single tensors"; at most 128 tensors in a list; group_list as a
# tensor is int64, cumulative (group_list_type 0) or counts (1); group_type 0 splits M, 2 splits K.
def _grouped_matmul_problem(a):
    x, w = a["x"], a["weight"]
    if a["bias"] is not None or a["scale"] is not None or a["act_type"]:
        return "bias, quantisation and fused activations are not modelled by the stand-in"
    dtypes = {t.dtype for t in list(x) + list(w)}
    if len(dtypes) != 1 or not dtypes <= set(FLOATS):
        return f"x and weight must share one float dtype, got {sorted(str(d) for d in dtypes)}"
    if torch.float32 in dtypes and not (len(x) == 1 and len(w) == 1 and a["split_item"] in (2, 3)):
        return (f"float32 needs a single x, weight and y tensor; got {len(x)} x and {len(w)} weight tensors "
                f"(split_item {a['split_item']})")
    gl = a["group_list"]
    if gl is None or gl.dtype != torch.int64 or gl.dim() != 1:
        return f"group_list must be a 1-D int64 tensor, got {None if gl is None else (gl.dtype, tuple(gl.shape))}"
    if a["group_list_type"] not in (0, 1):
        return f"group_list_type {a['group_list_type']} is not 0 (cumulative) or 1 (counts)"
    if gl.numel() > 128:
        return f"{gl.numel()} groups; the kernel takes lists of at most 128"
    counts = gl if a["group_list_type"] == 1 else torch.diff(gl, prepend=gl.new_zeros(1))
    if bool((counts < 0).any()):
        return f"group_list {gl.tolist()} is not {'ascending' if a['group_list_type'] == 0 else 'non-negative'}"
    axis = x[0].shape[0] if a["group_type"] == 0 else x[0].shape[1]
    if int(counts.sum()) != axis:
        return f"group_list covers {int(counts.sum())} rows, the split axis has {axis}"
    if a["group_type"] == 0:
        weights = list(w[0]) if len(w) == 1 and w[0].dim() == 3 else list(w)
        if len(weights) != gl.numel():
            return f"{len(weights)} weights for {gl.numel()} groups"
        if any(t.dim() != 2 or t.shape[0] != x[0].shape[1] for t in weights):
            return f"weights {[tuple(t.shape) for t in weights]} do not take x's K = {x[0].shape[1]}"
    elif len(w) != 1 or w[0].dim() != 2 or w[0].shape[0] != x[0].shape[1]:
        return "group_type 2 takes one x [K_out, M] and one weight [M, N]"


GROUPED_MATMUL = (_grouped_matmul_problem,)


# torch_npu's meta function returns sorted_indices as int32, and torch_npu's own tests of
# permute/unpermute feed int32 sorted indices back; padded_mode True is not supported. Tokens
# fp16/bf16/fp32, indices int32 or int64, topk at most 512.
MOE_TOKEN_PERMUTE = (
    _dtype("tokens", FLOATS),
    _dtype("indices", (torch.int32, torch.int64)),
    _check(lambda a: a["indices"].dim() == 1 or a["indices"].shape[-1] <= 512,
           lambda a: f"topk {a['indices'].shape[-1]} must be at most 512"),
    _check(lambda a: not a["padded_mode"], "padded_mode=True is not supported"),
)

# npu_moe_token_unpermute takes sorted_indices int32 only (what permute returns), 1-D; probs, when
# given, [T, topk] in the tokens' dtype (MindSpeed casts the tokens to the probs' dtype before the
# kernel for this reason); without probs topk is 1 (torch_npu's meta function).
MOE_TOKEN_UNPERMUTE = (
    _dtype("permuted_tokens", FLOATS),
    _dtype("sorted_indices", (torch.int32,)),
    _same_dtype("probs", "permuted_tokens"),
    _check(lambda a: a["probs"] is None or a["probs"].numel() == a["sorted_indices"].numel(),
           lambda a: f"probs {tuple(a['probs'].shape)} must have one entry per sorted index "
                     f"({a['sorted_indices'].numel()})"),
    _check(lambda a: not a["padded_mode"], "padded_mode=True is not supported"),
)
