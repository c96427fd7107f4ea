"""``--attention-backend`` in this backend's words: the kernel it names, mapped onto the ones we have.

Megatron's flag picks among Transformer Engine's attention kernels (it sets ``NVTE_FLASH_ATTN`` and
friends). Where Transformer Engine's attention runs (CUDA, TE installed, ``--transformer-impl
transformer_engine``) the flag goes through unchanged. Elsewhere the local layer spec computes
attention, and the flag is rewritten before features are chosen, with a printed line:

* ``flash``, ``fused`` -> ``--use-flash-attn`` (``adaptor.ops.flash_attention.FlashAttention``);
* ``unfused``, ``local`` -> megatron-core's local ``DotProductAttention`` (the local spec's own);
* ``auto`` -> this backend's default: ``DotProductAttention``, or FlashAttention with ``--use-flash-attn``.

The flag itself is dropped, so Megatron keeps its default ``auto`` (``--attention-backend local``
would also need Megatron-LM's ``--spec local``, which validate_args asserts). A request the mapped
kernel cannot serve is refused in one line. Plain Python (no torch, Megatron or ``adaptor``).
"""
from __future__ import annotations

from adaptor.command_line.mindspeed_llm import Rewrite, _present, _remove, value_of

FLAG = "--attention-backend"
CHOICES = ("flash", "fused", "unfused", "local", "auto")

#: --attention-backend value -> (what computes attention here, the flags that ask for it)
MAPPING = {
    "flash": ("FlashAttention (--use-flash-attn)", ["--use-flash-attn"]),
    "fused": ("FlashAttention (--use-flash-attn)", ["--use-flash-attn"]),
    "unfused": ("megatron-core's local DotProductAttention", []),
    "local": ("megatron-core's local DotProductAttention", []),
}


def flash_attention_refusal(softmax_type: str | None, window_size) -> str | None:
    """Why FlashAttention cannot serve these settings (the rest of the sentence), or None."""
    if softmax_type not in (None, "vanilla"):
        return f"supports --softmax-type vanilla only, not {softmax_type}"
    if window_size is not None:
        return "does not support --window-size (sliding-window attention)"
    return None


def transformer_engine_attention(argv: list[str], backend: str, te_installed: bool) -> bool:
    """Whether Transformer Engine's attention runs for this command line (Megatron's default impl is TE)."""
    return backend == "cuda" and te_installed and value_of(argv, "--transformer-impl") != "local"


def rewrite_attention_backend(argv: list[str], backend: str, te_installed: bool) -> Rewrite:
    """``argv`` with ``--attention-backend`` mapped onto this backend's kernels (see the module docstring)."""
    result = Rewrite(list(argv))
    if not _present(argv, FLAG) or transformer_engine_attention(argv, backend, te_installed):
        return result
    value = value_of(argv, FLAG)
    if value not in CHOICES:  # Megatron's parser says what is allowed
        return result
    result.argv = _remove(result.argv, FLAG, 1)
    flash_asked = _present(argv, "--use-flash-attn")
    if value == "auto":
        kernel = MAPPING["flash" if flash_asked else "local"][0]
        result.notes.append(f"{FLAG} auto: {kernel}, this backend's default")
        return result
    kernel, flags = MAPPING[value]
    if flash_asked and not flags:
        result.refused.append(f"{FLAG} {value} asks for {kernel}, --use-flash-attn for FlashAttention; drop one of them")
        return result
    if flags:
        why = flash_attention_refusal(value_of(argv, "--softmax-type"), value_of(argv, "--window-size")
                                      if _present(argv, "--window-size") else None)
        if why:
            result.refused.append(f"{FLAG} {value} maps to {kernel} here, which {why}; "
                                  f"drop {FLAG} (Megatron's local DotProductAttention serves it) or that setting")
            return result
        result.argv += [f for f in flags if not _present(result.argv, f)]
    result.notes.append(f"{FLAG} {value}: {kernel} (Transformer Engine's attention, which the flag picks among, does not run here)")
    return result
