"""``--experimental-attention-variant gated_delta_net`` (Qwen3-Next's Gated DeltaNet layers) without fla.

Upstream: ``megatron.core.ssm.gated_delta_net.common`` imports ``causal_conv1d``, ``l2norm`` and
``chunk_gated_delta_rule`` from flash-linear-attention (fla, Triton kernels, CUDA only), sets them
to None and ``HAVE_FLA = False`` when it is missing, and ``_GDNBase.__init__`` then raises
ImportError; ``gdn.py`` holds its own copies of ``causal_conv1d`` and ``chunk_gated_delta_rule``
(bound to ``GatedDeltaNet.gated_delta_rule`` at construction). Even ``--deterministic-mode``, which
runs megatron-core's torch rule and ``F.conv1d``, calls fla's ``l2norm`` on queries and keys.
Where fla cannot be imported, this feature fills those names in both modules (and the package's
re-exports) with :mod:`adaptor.ops.gated_delta_rule`'s torch counterparts, same signatures and
return values, and sets ``HAVE_FLA`` so the layer builds. Where fla is installed nothing is patched.

It also wraps ``_GDNBase._prepare_input_for_gated_delta_rule`` (a ``jit_fuser``, i.e. ``torch.compile``,
function) to hand it a contiguous ``qkv``: ``--deterministic-mode`` passes the convolution's output
transposed (strides of ``[B, D, T]``), and inductor's CPU code for the function returned NaN queries,
keys and values from such an input in bf16 (torch 2.14.1; eager and a contiguous input are right),
so the first step's loss was NaN. fla's convolution, and ours, return it contiguous already.

The layers themselves come from ``adaptor.layer_specs`` (the local GDN layer pattern), and the
checks below refuse what the local path cannot give in one line.

Remove when: megatron-core ships a torch fallback for the three fla kernels (0.19.2 has only
``torch_chunk_gated_delta_rule``, still with fla's ``l2norm``); no upstream issue or PR found.
"""
from __future__ import annotations

import importlib.util

from adaptor.errors import ArgumentError
from adaptor.features import Feature

OWNER = __name__
COMMON = "megatron.core.ssm.gated_delta_net.common"
GDN = "megatron.core.ssm.gated_delta_net.gdn"
PACKAGE = "megatron.core.ssm.gated_delta_net"
OPS = "adaptor.ops.gated_delta_rule"

#: (module, name) -> name in adaptor.ops.gated_delta_rule (None: the HAVE_FLA switch)
FILLED = {
    (COMMON, "causal_conv1d"): "causal_conv1d",
    (COMMON, "l2norm"): "l2norm",
    (COMMON, "chunk_gated_delta_rule"): "chunk_gated_delta_rule",
    (COMMON, "HAVE_FLA"): None,
    (GDN, "causal_conv1d"): "causal_conv1d",
    (GDN, "chunk_gated_delta_rule"): "chunk_gated_delta_rule",
    (PACKAGE, "causal_conv1d"): "causal_conv1d",
    (PACKAGE, "l2norm"): "l2norm",
    (PACKAGE, "chunk_gated_delta_rule"): "chunk_gated_delta_rule",
    (PACKAGE, "HAVE_FLA"): None,
}


def _contiguous_qkv(wrapped, instance, args, kwargs):
    if args:
        args = (args[0].contiguous(), *args[1:])
    return wrapped(*args, **kwargs)


def fla_missing() -> bool:
    try:
        return importlib.util.find_spec("fla") is None
    except (ImportError, ValueError):
        return True


_BOUNDARY_FLAGS = {
    "eod": "--reset-attention-mask",
    "documents": "--dataloader-inter-document-masking",
    "conversations": "fine-tuning data (conversation boundaries)",
}


def is_gated_delta_net(args) -> bool:
    return getattr(args, "experimental_attention_variant", None) == "gated_delta_net"


class GatedDeltaNetWithoutFla(Feature):
    name = "gated_delta_net"

    def register_patches(self, pm, ctx) -> None:
        from adaptor.ops import gated_delta_rule as ops

        if not fla_missing():
            return
        for (module, name), ours in FILLED.items():
            pm.register_replacement(f"{module}.{name}", True if ours is None else getattr(ops, ours), OWNER)
        pm.register_wrapper(f"{COMMON}._GDNBase._prepare_input_for_gated_delta_rule", _contiguous_qkv, OWNER)

    def validate(self, args, ctx) -> None:
        if getattr(args, "experimental_attention_variant", None) == "dsa":
            raise ArgumentError("--experimental-attention-variant dsa: DeepSeek sparse attention layers are not built "
                                "by the local layer spec (its indexer needs a plain linear module and megatron-core's "
                                "DSA kernels, which the local spec lacks); drop it")
        if not is_gated_delta_net(args):
            return
        from adaptor.batch_format import Boundaries, batch_format

        fmt = batch_format(args)
        if fmt.boundaries is not Boundaries.NONE and not fmt.thd:
            raise ArgumentError(f"{_BOUNDARY_FLAGS[fmt.boundaries.value]} with --experimental-attention-variant "
                                "gated_delta_net: document boundaries would reach the layers as a dense attention "
                                "mask, which gated-delta-net layers do not read, so their recurrence would run "
                                "across documents; add --use-flash-attn (packed THD batches, whose cu_seqlens "
                                "GDN takes) or drop it")
        if fmt.thd and getattr(args, "deterministic_mode", False):
            raise ArgumentError("packed sequences with --experimental-attention-variant gated_delta_net and "
                                "--deterministic-mode: megatron-core's GDN runs packed (THD) batches only "
                                "outside deterministic mode; drop --deterministic-mode")
