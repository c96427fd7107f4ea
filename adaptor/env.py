"""Every ``ADAPTOR_*`` environment variable, declared and read in one place.

No variable is needed for a normal run; each changes one behaviour, named here. The table
:data:`VARIABLES` is also the source of the environment page in ``docs/``. This module imports
nothing but the standard library, so tools and the patch manager alike can read it first.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    meaning: str


VARIABLES = {
    v.name: v
    for v in (
        Variable("ADAPTOR_BACKEND", "",
                 "`npu`, `cuda` or `cpu`: train on this backend instead of the detected one "
                 "(detection order: NPU, CUDA, CPU); only that backend is looked at, so `cpu` trains on "
                 "CPU on a host whose torch_npu or CUDA is installed but broken, which otherwise stops "
                 "the run ([backends](backends.md))."),
        Variable("ADAPTOR_EARLY_CHECK", "1",
                 "`0`: an entry file's command line is checked only when Megatron parses it, after "
                 "the imports, instead of first from the parser's snapshot (the errors are the same "
                 "lines; the early check answers in about a second)."),
        Variable("ADAPTOR_QUIET", "0",
                 "`1`: rank 0 does not print the start-up summary (backend, features, patches) nor "
                 "the one-time lines naming the kernels in use."),
        Variable("ADAPTOR_REPORT_MEMORY", "0",
                 "`1`: each rank prints the model state it holds after the first step and its peak "
                 "memory at the end (the memory_report feature)."),
        Variable("ADAPTOR_CE_CHUNK_TOKENS", "",
                 "Tokens per chunk of `--cross-entropy-loss-fusion` (default: a 128 MiB fp32 chunk)."),
        Variable("ADAPTOR_CE_GRAD_IN_PLACE", "1",
                 "`0`: `--cross-entropy-loss-fusion` keeps its gradient in a separate buffer instead "
                 "of the logits' storage."),
        Variable("ADAPTOR_TORCHRUN", "",
                 "The command the tools start distributed workers with (`check_hf_parity.py`, "
                 "`check_vision_parity.py`, the re-layout of `safetensors_ckpt.py`), split as a shell "
                 "would; default `python -m torch.distributed.run` (`torchrun` in the example scripts, "
                 "which honour it too). A cluster's launcher wrapper goes here; the test suite puts its "
                 "warm launcher here."),
        Variable("ADAPTOR_ERROR_GRACE_S", "10",
                 "Seconds a rank other than 0 waits before exiting on a command-line error, so "
                 "rank 0 prints the reason first under torchrun."),
    )
}


def value(name: str, environ=None) -> str:
    """The variable's value, stripped, or its declared default when unset."""
    env = os.environ if environ is None else environ
    return env.get(name, VARIABLES[name].default).strip()


def is_on(name: str, environ=None) -> bool:
    """True unless the variable is empty or ``0`` (a declared default counts when unset)."""
    return value(name, environ) not in ("", "0")


def quiet() -> bool:
    return is_on("ADAPTOR_QUIET")


def torchrun_command() -> list[str]:
    """``ADAPTOR_TORCHRUN`` split into words, or this interpreter's ``-m torch.distributed.run``."""
    import shlex
    import sys

    return shlex.split(value("ADAPTOR_TORCHRUN")) or [sys.executable, "-m", "torch.distributed.run"]
