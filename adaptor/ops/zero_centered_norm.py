"""Zero-centred gamma (``--apply-layernorm-1p``): a norm that scales by ``1 + weight``.

The stored parameter is gamma itself, initialised to zeros, as Megatron's apex ``FusedLayerNorm``
and Transformer Engine's norms store it with ``zero_centered_gamma``; at initialisation the norm
computes what the plain norm with ``weight = 1`` computes. Weight decay then pulls the scale towards
one, not zero (Gemma's ``(1 + weight)`` norms are the same function).

:func:`zero_centre` turns the torch ``LayerNorm``/``RMSNorm`` that megatron-core's
``WrappedTorchNorm`` builds into its zero-centred subclass in place, so the parameter objects and
the attributes set on them (``sequence_parallel``) are kept.

With a half-precision gamma (``--bf16``/``--fp16``), ``1 + gamma`` is formed and applied in fp32 and
the result rounded once: in bf16, ``1 + gamma`` would move in steps of 1/128 and hide the small
updates of gamma, which is why the zero-centred kernels (apex, TE) add the one in fp32 too.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_LOW = (torch.float16, torch.bfloat16)


class ZeroCenteredRMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` computing ``rms_norm(x) * (1 + weight)``; weight starts at zeros."""

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype in _LOW:
            return F.rms_norm(x.float(), self.normalized_shape, self.weight.float() + 1, self.eps).to(x.dtype)
        return F.rms_norm(x, self.normalized_shape, self.weight + 1, self.eps)


class ZeroCenteredLayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` computing ``layer_norm(x) * (1 + weight) + bias``; weight starts at zeros."""

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            torch.nn.init.zeros_(self.weight)
            if self.bias is not None:
                torch.nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype in _LOW:
            bias = None if self.bias is None else self.bias.float()
            return F.layer_norm(x.float(), self.normalized_shape, self.weight.float() + 1, bias, self.eps).to(x.dtype)
        return F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


_ZERO_CENTRED = {torch.nn.RMSNorm: ZeroCenteredRMSNorm, torch.nn.LayerNorm: ZeroCenteredLayerNorm}


def zero_centre(norm: torch.nn.Module) -> torch.nn.Module:
    """The same module, now zero-centred: its class becomes the subclass and gamma is reset to zeros."""
    cls = _ZERO_CENTRED.get(type(norm))
    if cls is None:
        raise TypeError(f"no zero-centred gamma for {type(norm).__name__}")
    norm.__class__ = cls
    norm.reset_parameters()
    return norm
