"""``--use-fused-rmsnorm``: RMSNorm in one kernel instead of torch.nn.RMSNorm.

Upstream: the local layer spec builds ``megatron.core.transformer.torch_norm.
WrappedTorchNorm`` for every norm (input/pre-MLP/final layernorm and
qk-layernorm), which returns ``torch.nn.RMSNorm``. With this flag the feature's
``module_swaps`` row puts ``adaptor.ops.rmsnorm.FusedRMSNorm`` in its place: ``torch_npu.npu_rms_norm``
on NPU, one autograd Function (fp32 statistics, saves rstd) on CUDA/CPU. Same
parameter name (``weight``) and initialisation, so checkpoints are
interchangeable; ``--normalization LayerNorm`` still builds what upstream
builds. With ``--transformer-impl transformer_engine`` TE's own fused norm
stays. No function is patched: the swap happens in the layer spec.
"""
from __future__ import annotations

from adaptor.features import Feature


class RmsNormFusion(Feature):
    name = "rmsnorm"
    module_swaps = (
        ("use_fused_rmsnorm", "megatron.core.transformer.torch_norm:WrappedTorchNorm", "adaptor.ops.rmsnorm:FusedRMSNorm"),
    )

    def add_arguments(self, group) -> None:
        group.add_argument("--use-fused-rmsnorm", action="store_true", dest="use_fused_rmsnorm",
                           help="RMSNorm in one kernel: torch_npu.npu_rms_norm on NPU, a fused autograd "
                                "function on CUDA/CPU (local layer spec).")

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "use_fused_rmsnorm", False))
