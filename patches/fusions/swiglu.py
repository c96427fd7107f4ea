"""``--use-fused-swiglu``: SwiGLU in one kernel, on every backend.

Upstream: ``megatron.core.transformer.mlp.MLP.forward`` (and the MoE experts)
call ``megatron.core.fusions.fused_bias_swiglu.bias_swiglu_impl`` /
``weighted_bias_swiglu_impl`` only when ``config.bias_activation_fusion``
(``--bias-swiglu-fusion``) is on; those are ``torch.compile``d for CUDA, and
``backend_defaults`` turns the fusion off on CPU/NPU. This flag turns it on
(unless given explicitly) and replaces both functions (mlp.py, experts.py and
shared_experts.py imported them by name: rebound) with
``adaptor.ops.swiglu``'s: ``torch_npu.npu_swiglu`` on NPU, an autograd
Function that saves only its input on CUDA/CPU.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature

OWNER = __name__
TARGET = "megatron.core.fusions.fused_bias_swiglu"


class SwigluFusion(Feature):
    name = "swiglu"

    def add_arguments(self, group) -> None:
        group.add_argument("--use-fused-swiglu", action="store_true", dest="use_fused_swiglu",
                           help="SwiGLU in one kernel: torch_npu.npu_swiglu on NPU, a fused autograd "
                                "function on CUDA/CPU (turns on --bias-swiglu-fusion).")

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "use_fused_swiglu", False))

    def register_patches(self, pm, ctx) -> None:
        from adaptor.ops import swiglu

        pm.register_replacement(f"{TARGET}.bias_swiglu_impl", swiglu.bias_swiglu_impl, OWNER)
        pm.register_replacement(f"{TARGET}.weighted_bias_swiglu_impl", swiglu.weighted_bias_swiglu_impl, OWNER)

    def set_defaults(self, args, ctx) -> None:
        if "bias_swiglu_fusion" not in ctx.explicit:
            args.bias_swiglu_fusion = True

    def validate(self, args, ctx) -> None:
        if not args.swiglu:
            raise ArgumentError("--use-fused-swiglu needs --swiglu (the fused kernel is SwiGLU's)")
        if not args.bias_swiglu_fusion:
            raise ArgumentError("--use-fused-swiglu and --no-bias-swiglu-fusion contradict each other; drop one")
        if getattr(args, "use_te_activation_func", False):
            raise ArgumentError("--use-fused-swiglu and --use-te-activation-func both replace the activation; drop one")
        if getattr(args, "activation_func_clamp_value", None) is not None or getattr(args, "glu_linear_offset", 0.0):
            # megatron-core's fused SwiGLU path neither clamps nor offsets; only its unfused path does
            raise ArgumentError("--use-fused-swiglu computes plain SwiGLU; drop --activation-func-clamp-value and "
                                "--glu-linear-offset, or the fused flag")
        if getattr(args, "activation_func_fp8_input_store", False):
            raise ArgumentError("--use-fused-swiglu does not store the activation input in fp8; "
                                "drop --activation-func-fp8-input-store")
