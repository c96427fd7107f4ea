"""RMSNorm in one pass: ``torch_npu.npu_rms_norm`` on NPU, one autograd Function elsewhere.

:class:`FusedRMSNorm` takes the place of megatron-core's ``WrappedTorchNorm``
(same constructor). For ``--normalization RMSNorm`` it builds a module with
torch.nn.RMSNorm's parameter name and initialisation (``weight``, ones), so
checkpoints load either way; for any other normalization it builds exactly
what ``WrappedTorchNorm`` builds.
"""
from __future__ import annotations

import torch

from adaptor import run_state
from adaptor.log import announce_kernel

_KERNEL = {"npu": "torch_npu.npu_rms_norm", "cuda": "autograd function", "cpu": "autograd function"}
_LOW = (torch.float16, torch.bfloat16)


class _RMSNormFunction(torch.autograd.Function):
    """y = x * rstd * (w + offset) in fp32, rounded once; saves x, w and rstd (one float per row).

    ``offset`` is 1 for a zero-centred gamma (``--apply-layernorm-1p``), else 0; it is added in fp32.

    Low-precision inputs are converted to fp32 once per pass: on CPU, mixed-dtype kernels
    (bf16 * fp32) are slower than a conversion followed by fp32 kernels.
    """

    @staticmethod
    def forward(ctx, x, weight, eps, offset=0.0):
        xf = x.float()
        norm = torch.linalg.vector_norm(xf, 2, dim=-1, keepdim=True)
        rstd = torch.rsqrt(norm.square_().div_(x.shape[-1]).add_(eps))
        y = torch.mul(xf, rstd).mul_(weight.float() + offset if offset else weight.float())
        ctx.save_for_backward(x, weight, rstd)
        ctx.offset = offset
        return y.to(torch.promote_types(x.dtype, weight.dtype))

    @staticmethod
    def backward(ctx, grad):
        # dx = rstd * gw - x * rstd^3 * mean(gw * x), gw = grad * (w + offset);  dw = sum_rows(grad * x * rstd)
        x, weight, rstd = ctx.saved_tensors
        xf, gf = x.float(), grad.float()
        gw = gf * (weight.float() + ctx.offset if ctx.offset else weight.float())
        coef = (gw * xf).sum(-1, keepdim=True).mul_(rstd.pow(3)).div_(x.shape[-1])
        dx = gw.mul_(rstd).addcmul_(xf, coef, value=-1)
        dweight = (gf * rstd).mul_(xf).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dweight.to(weight.dtype), None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension with the kernel for the backend in use.

    ``zero_centered``: scale by ``1 + weight`` (``--apply-layernorm-1p``), the one added in fp32.
    """
    if run_state.backend().name == "npu":
        import torch_npu

        if zero_centered:  # the kernel has no offset: an fp32 gamma of 1 + weight, which it takes with any x
            return torch_npu.npu_rms_norm(x, weight.float() + 1, epsilon=eps)[0]

        # The kernel takes gamma in x's dtype, or fp32 with fp16/bf16 x; never a low-precision
        # gamma with fp32 x (e.g. --fp32-residual-connection under --bf16).
        if weight.dtype != x.dtype and not (weight.dtype == torch.float32 and x.dtype in _LOW):
            weight = weight.to(x.dtype)
        return torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]
    return _RMSNormFunction.apply(x, weight, eps, 1.0 if zero_centered else 0.0)


class FusedRMSNorm(torch.nn.Module):
    """Drop-in for ``WrappedTorchNorm`` (config, hidden_size, eps, ...)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        if config.normalization != "RMSNorm":
            from megatron.core.transformer.torch_norm import WrappedTorchNorm

            return WrappedTorchNorm(config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        return super().__new__(cls)

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        super().__init__()
        # Same limits as WrappedTorchNorm, except sequence parallelism (weight marked below) and
        # the zero-centred gamma of --apply-layernorm-1p: the stored weight is gamma, zeros at first.
        assert not config.memory_efficient_layer_norm, "memory_efficient_layer_norm not supported by FusedRMSNorm"
        self.normalized_shape = (hidden_size,)
        self.eps = eps
        self.zero_centered = bool(config.layernorm_zero_centered_gamma)
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size) if self.zero_centered
                                         else torch.ones(hidden_size))  # as torch.nn.RMSNorm
        # Megatron all-reduces the grads of parameters marked so across tensor-parallel ranks.
        setattr(self.weight, "sequence_parallel", config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        announce_kernel("fused RMSNorm", _KERNEL)
        return rms_norm(x, self.weight, self.eps, self.zero_centered)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}" + (", zero_centered_gamma" if self.zero_centered else "")
