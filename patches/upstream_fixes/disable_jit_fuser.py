"""Make ``--disable-jit-fuser`` run Megatron's fused functions uncompiled, as the flag says.

Upstream: ``megatron.core.jit.jit_fuser`` is ``torch.compile``, applied when each fusion module is
imported (bias+SwiGLU, bias+dropout+add, the MoE router's expert bias, ...). The flag is read
later, in ``megatron.training.global_vars.set_global_variables``, and only rebinds ``jit_fuser``
for modules imported after that, so it turns off none of them. A compiled function reads
``torch._dynamo.config.disable`` at each call; we set it, and every ``torch.compile``d function
runs its own Python body (Megatron's fusions are the only ``torch.compile`` use of a training run).
Without compilation a process does not start inductor (a C++ compiler on CPU, seconds per process
and per new shape). The NPU backend always runs them uncompiled (``npu_device``).

Remove when: ``jit_fuser`` chooses between ``torch.compile`` and the plain function at the first
call, after the flag is read. megatron-core 0.19.2 chooses at import; a lazy decorator that fixes
it is https://github.com/flagos-ai/Megatron-LM-FL/pull/122 (a fork: the same code stands upstream).
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__


class DisableJitFuser(Feature):
    name = "disable_jit_fuser"
    backends = ("cuda", "cpu")
    upstream_flags = ("--disable-jit-fuser",)

    def enabled(self, ctx) -> bool:
        return super().enabled(ctx) and bool(getattr(ctx.flags, "disable_jit_fuser", False))

    def register_patches(self, pm, ctx) -> None:
        pm.register_replacement("torch._dynamo.config.disable", True, OWNER)
