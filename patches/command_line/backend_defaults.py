"""Pick Megatron settings that fit the backend, unless the user chose them.

Upstream defaults assume a CUDA host with Transformer Engine and apex:
``--distributed-backend nccl``, ``--transformer-impl transformer_engine``,
gradient-accumulation fusion (an apex CUDA kernel) and CUDA-only bias/softmax/
RoPE fusions. This feature sets, per backend, only the values the user did
not pass on the command line (an explicit flag always wins), and prints what
it set, so the same Megatron command line runs on NPU, GPU and CPU.

``--async-save`` runs Megatron's checkpoint writer under ``--async-strategy``, whose default
``nvrx`` imports nvidia-resiliency-ext; where that library is not installed, ``mcore`` (Megatron's
own writer and persistent worker, which need nothing else) is set instead, unless the user chose a
strategy (an explicit ``nvrx`` without the library is refused in one line). ``--async-save`` with
``--ckpt-format torch``, which Megatron's ``save_checkpoint`` only meets with NotImplementedError at
the first save, is refused before the run starts.

Megatron-FSDP (``--use-megatron-fsdp``) runs on every backend; off CUDA it gets the two settings its
collectives need: ``CUDA_DEVICE_MAX_CONNECTIONS`` left unset, or unset where Megatron-LM's scripts export 1
(Megatron asserts it is not 1 there; it tunes CUDA streams only) and
``--no-gradient-reduce-div-fusion`` (NCCL's pre-multiplied sum is not in gloo or HCCL). Its hybrid
sharding (``--num-distributed-optimizer-instances`` > 1) is refused there: on gloo it ran, resumed, and
trained another curve than one process (6.191 against 6.180 at the second step, DP=4 as 2×2).

Two explicit values are taken as the same request in this backend's words, with a printed line:
a ``--distributed-backend`` this backend has no library for (MindSpeed-LLM's scripts say ``nccl``
on Ascend, where it means hccl; on CPU it means gloo), and ``--transformer-impl
transformer_engine`` where Transformer Engine cannot run (megatron-core's local layers compute the
same model). ``--attention-backend`` gets the same treatment before features are chosen
(``rewrite_argv``, :mod:`adaptor.command_line.attention_backend`): flash/fused become
``--use-flash-attn``, unfused/local megatron-core's DotProductAttention, auto this backend's default,
printed; a kernel that cannot serve the rest of the command line is refused in one line.
"""
from __future__ import annotations

import importlib.util
import os

from adaptor import run_state
from adaptor.command_line.attention_backend import rewrite_attention_backend
from adaptor.command_line.mindspeed_llm import Rewrite
from adaptor.features import ArgumentError, Feature
from adaptor.log import notice_once

NVRX = "nvidia_resiliency_ext"
_CUDA_ONLY_FUSIONS = ("masked_softmax_fusion", "bias_gelu_fusion", "bias_swiglu_fusion",
                      "bias_dropout_fusion", "apply_rope_fusion")



def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def backend_defaults(backend: str) -> dict:
    """Megatron argument dests and the values this backend needs."""
    defaults = {"distributed_backend": {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[backend]}
    if backend != "cuda" or not _importable("transformer_engine"):
        defaults["transformer_impl"] = "local"
    if backend != "cuda" or not _importable("fused_weight_gradient_mlp_cuda"):
        defaults["gradient_accumulation_fusion"] = False
    if backend != "cuda" or not _importable("apex"):
        defaults["no_persist_layer_norm"] = True  # apex's persistent LayerNorm kernel
    if backend in ("cpu", "npu"):
        defaults.update({name: False for name in _CUDA_ONLY_FUSIONS})
    if backend == "cpu":
        defaults["use_cpu_initialization"] = True
    return defaults


class BackendDefaults(Feature):
    name = "backend_defaults"

    def __init__(self) -> None:
        self.attention: Rewrite | None = None

    def rewrite_argv(self, argv: list[str]) -> list[str]:
        backend = run_state.backend().name
        self.attention = rewrite_attention_backend(argv, backend, backend == "cuda" and _importable("transformer_engine"))
        return self.attention.argv

    def set_defaults(self, args, ctx) -> None:
        changed = []
        # Megatron asserts this CUDA scheduling knob is 1 for TP/CP (and not 1 under Megatron-FSDP,
        # which takes precedence); it means nothing off CUDA.
        if ctx.backend.name != "cuda" and "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ \
                and not getattr(args, "use_megatron_fsdp", False):
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
            changed.append("CUDA_DEVICE_MAX_CONNECTIONS=1")
        if ctx.backend.name != "cuda" and getattr(args, "use_megatron_fsdp", False) \
                and os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
            del os.environ["CUDA_DEVICE_MAX_CONNECTIONS"]  # Megatron-LM's scripts export it; it is CUDA's only
            changed.append("CUDA_DEVICE_MAX_CONNECTIONS unset (Megatron asserts it is not 1 under Megatron-FSDP)")
        # Megatron-FSDP divides gradients inside the reduction with NCCL's pre-multiplied sum, which
        # gloo and HCCL do not have; dividing first and summing is the same average.
        if ctx.backend.name != "cuda" and getattr(args, "use_megatron_fsdp", False) \
                and getattr(args, "gradient_reduce_div_fusion", False):
            args.gradient_reduce_div_fusion = False
            changed.append("gradient_reduce_div_fusion=False (Megatron-FSDP: NCCL's pre-multiplied sum is "
                           f"not in {ctx.backend.name}'s collectives; gradients are divided, then summed)")
        wanted = backend_defaults(ctx.backend.name)
        for dest, value in wanted.items():
            if dest in ctx.explicit or getattr(args, dest, None) == value:
                continue
            setattr(args, dest, value)
            changed.append(f"{dest}={value}")
        for dest, flag, unusable in (("distributed_backend", "--distributed-backend", ("nccl", "hccl")),
                                     ("transformer_impl", "--transformer-impl", ("transformer_engine",))):
            given = getattr(args, dest, None)
            if dest in ctx.explicit and given in unusable and dest in wanted and given != wanted[dest]:
                setattr(args, dest, wanted[dest])
                changed.append(f"{dest}={wanted[dest]} (for {flag} {given}, which this backend cannot run)")
        if getattr(args, "async_save", False) and "async_strategy" not in ctx.explicit \
                and getattr(args, "async_strategy", None) == "nvrx" and not _importable(NVRX):
            args.async_strategy = "mcore"
            changed.append("async_strategy=mcore (for --async-save: the default nvrx needs nvidia-resiliency-ext, "
                           "which is not installed; Megatron's own checkpoint worker writes)")
        if changed:
            notice_once(f"{ctx.backend.name} defaults: {', '.join(changed)}")
        for note in self.attention.notes if self.attention else ():
            notice_once(note)

    def validate(self, args, ctx) -> None:
        if self.attention is not None and self.attention.refused:
            raise ArgumentError(self.attention.refused[0])
        if ctx.backend.name != "cuda" and getattr(args, "use_megatron_fsdp", False) \
                and getattr(args, "num_distributed_optimizer_instances", 1) > 1:
            raise ArgumentError(
                "--num-distributed-optimizer-instances > 1 with --use-megatron-fsdp (hybrid sharding) trains "
                f"another loss curve than one process on {ctx.backend.name} here; use one instance "
                "(Megatron-FSDP then shards over every data-parallel rank)")
        if getattr(args, "async_save", False) and getattr(args, "ckpt_format", None) == "torch" \
                and getattr(args, "save", None):
            raise ArgumentError("--async-save is not implemented by Megatron for --ckpt-format torch; use "
                                "--ckpt-format safetensors or torch_dist, or drop --async-save")
        if getattr(args, "async_save", False) and getattr(args, "async_strategy", None) == "nvrx" \
                and "async_strategy" in ctx.explicit and not _importable(NVRX):
            raise ArgumentError("--async-strategy nvrx needs nvidia-resiliency-ext, which is not installed; "
                                "install it or pass --async-strategy mcore (Megatron's own checkpoint worker)")
