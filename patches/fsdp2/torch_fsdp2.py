"""``--use-torch-fsdp2`` (Megatron's flag) on NPU, GPU and CPU, configured by ``--fsdp2-config-path``.

Upstream code changed, and why:

* ``megatron.core.distributed.torch_fully_sharded_data_parallel.TorchFullyShardedDataParallel``
  is replaced by :class:`adaptor.fsdp2.wrapper.FullyShardedModel`, a subclass: upstream builds its
  device mesh for "cuda" only and shards fixed module classes; ours uses the backend's device, the
  YAML plan (units, ignored and recomputed modules, prefetch, offload) and fp32 master weights
  under ``--bf16`` (every alias, e.g. ``training.torch_FSDP``, is rebound by the patch manager).
* ``megatron.training.arguments.validate_args`` asserts, for FSDP2, untied embeddings,
  ``--ckpt-format torch_dist|torch_dcp`` and ``CUDA_DEVICE_MAX_CONNECTIONS`` != 1 (which the
  backend defaults set to 1 off CUDA).
  None is fundamental here: tied embeddings work when the shared weight stays in the root unit
  (the plan sees to it); the checkpoint format matters only when saving or loading (we accept
  ``torch_dist`` and ``safetensors``); the connections variable is a CUDA scheduling knob. The
  replacement runs the original with those three values set to ones it accepts and restores
  them; the limits that are real (pipeline and expert parallelism, the distributed optimizer,
  gradient-accumulation fusion, fp16) are one-line errors from :meth:`TorchFsdp2.validate`
  first. It is a replacement, not a wrapper, so that every other feature's checks and wrappers
  see the user's real values.
* ``megatron.training.training.get_megatron_ddp_config``: the checked YAML plan rides on the
  FSDP2 config object to the wrapper.
* ``megatron.core.utils.get_data_parallel_group_if_dtensor``: the gradient norm and the zero count
  (``optimizer.clip_grads``) fold it over the gradients, and upstream returns None for a plain
  tensor even when a DTensor before it gave the group, so the last gradient decides whether the
  sum runs over the data-parallel ranks. With ``ignored_modules`` (plain, replicated gradients,
  counted on one data-parallel rank only) the ranks then disagree and the all-reduce hangs. A
  plain tensor now keeps the group found so far.
* ``megatron.training.training.get_megatron_optimizer_config``: with FSDP2 the sharded parameters
  are already the fp32 master weights, so under ``--bf16`` nothing is left for Megatron's Float16
  optimizer to do (it keeps fp32 copies of bf16 parameters); the optimizer config's bf16 is
  turned off and Megatron builds its plain ``FP32Optimizer``.

The checkpoint fixes FSDP2 needs are :mod:`patches.fsdp2.sharded_checkpoint`.

Remove when: for the ``get_data_parallel_group_if_dtensor`` wrapper, the only part that works around
an upstream defect, upstream keeps the group found so far when it is given a plain tensor (or
``clip_grads`` stops folding it over the gradients one at a time). Not fixed upstream as of
megatron-core 0.19.2 (utils.py lines 1194-1202) nor on Megatron-LM main (d98e8a64, 2026-08-22); no
upstream issue or PR found. The other changes adapt Megatron's FSDP2 path to this adaptor's wrapper
and backends and stay while that wrapper replaces upstream's.
"""
from __future__ import annotations

import os

import torch

from adaptor.features import ArgumentError, Feature
from adaptor.wrapping import argument, overridden

OWNER = __name__
VALIDATE_ARGS = "megatron.training.arguments.validate_args"
UPSTREAM_CLASS = "megatron.core.distributed.torch_fully_sharded_data_parallel.TorchFullyShardedDataParallel"
CHECKPOINT_FORMATS = ("torch_dist", "safetensors")
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


def _lenient_validate_args(original, backend: str):
    def validate_args(args, defaults={}):  # noqa: B006  (Megatron's signature)
        if not getattr(args, "use_torch_fsdp2", False):
            return original(args, defaults)
        ckpt_format = args.ckpt_format if args.ckpt_format in ("torch_dist", "torch_dcp") else "torch_dist"
        connections = os.environ.pop(CONNECTIONS, None) if backend != "cuda" else None
        try:
            with overridden(args, untie_embeddings_and_output_weights=True, ckpt_format=ckpt_format):
                return original(args, defaults)
        finally:
            if connections is not None:
                os.environ[CONNECTIONS] = connections

    return validate_args


def _attach_plan(wrapped, instance, call_args, kwargs):
    from adaptor.fsdp2.config import config_from_args

    ddp_config = wrapped(*call_args, **kwargs)
    args = argument(call_args, kwargs, "args")
    if getattr(args, "use_torch_fsdp2", False):
        ddp_config.fsdp2_config = config_from_args(args)
    return ddp_config


def _keep_data_parallel_group(wrapped, instance, call_args, kwargs):
    found = wrapped(*call_args, **kwargs)
    if found is not None:
        return found
    return call_args[1] if len(call_args) > 1 else kwargs.get("data_parallel_group")


def _fp32_optimizer(wrapped, instance, call_args, kwargs):
    config, overrides = wrapped(*call_args, **kwargs)
    args = argument(call_args, kwargs, "args")
    if getattr(args, "use_torch_fsdp2", False):
        config.bf16 = config.fp16 = False
        config.params_dtype = torch.float32
    return config, overrides


class TorchFsdp2(Feature):
    name = "torch_fsdp2"
    upstream_flags = ("--use-torch-fsdp2",)

    def add_arguments(self, group) -> None:
        group.add_argument("--fsdp2-config-path", default=None, dest="fsdp2_config_path", metavar="YAML",
                           help="FSDP2 plan (MindSpeed-MM keys): sub_modules_to_wrap, reshard_after_forward, "
                                "param_dtype, reduce_dtype, offload_to_cpu, ignored_modules, recompute_modules, "
                                "num_to_forward_prefetch. Needs --use-torch-fsdp2.")

    def enabled(self, ctx) -> bool:
        flags = ctx.flags
        return super().enabled(ctx) and bool(getattr(flags, "use_torch_fsdp2", False)
                                             or getattr(flags, "fsdp2_config_path", None))

    def register_patches(self, pm, ctx) -> None:
        from adaptor.fsdp2.wrapper import FullyShardedModel

        pm.register_replacement(UPSTREAM_CLASS, FullyShardedModel, OWNER)
        pm.register_replacement(VALIDATE_ARGS, _lenient_validate_args(pm.original(VALIDATE_ARGS), ctx.backend.name),
                                OWNER)
        pm.register_wrapper("megatron.training.training.get_megatron_ddp_config", _attach_plan, OWNER)
        pm.register_wrapper("megatron.training.training.get_megatron_optimizer_config", _fp32_optimizer, OWNER)
        pm.register_wrapper("megatron.core.utils.get_data_parallel_group_if_dtensor", _keep_data_parallel_group, OWNER)

    def set_defaults(self, args, ctx) -> None:
        # Megatron turns gradient-accumulation fusion on by default where apex has the kernel;
        # it writes into DDP's main_grad buffers, which FSDP2 does not have.
        if getattr(args, "use_torch_fsdp2", False) and "gradient_accumulation_fusion" not in ctx.explicit:
            args.gradient_accumulation_fusion = False

    def validate(self, args, ctx) -> None:
        if not getattr(args, "use_torch_fsdp2", False):
            raise ArgumentError("--fsdp2-config-path needs --use-torch-fsdp2")
        unsupported = [
            (args.pipeline_model_parallel_size > 1, "pipeline parallelism (--pipeline-model-parallel-size "
                                                    f"{args.pipeline_model_parallel_size})"),
            (args.expert_model_parallel_size > 1, "expert parallelism (--expert-model-parallel-size "
                                                  f"{args.expert_model_parallel_size})"),
            (args.use_distributed_optimizer, "--use-distributed-optimizer (FSDP2 already shards the optimizer "
                                             "state over the data-parallel ranks)"),
            (getattr(args, "use_megatron_fsdp", False), "--use-megatron-fsdp (choose one FSDP)"),
            (args.gradient_accumulation_fusion, "gradient-accumulation fusion (it writes into DDP's main_grad "
                                                "buffers; pass --no-gradient-accumulation-fusion)"),
            (args.fp16, "--fp16 (no loss scaling for sharded gradients; use --bf16)"),
            (getattr(args, "init_model_with_meta_device", False), "--init-model-with-meta-device"),
        ]
        for bad, what in unsupported:
            if bad:
                raise ArgumentError(f"--use-torch-fsdp2 does not support {what}")
        if (args.save or args.load) and args.ckpt_format not in CHECKPOINT_FORMATS:
            raise ArgumentError(f"--use-torch-fsdp2 saves and loads checkpoints as --ckpt-format "
                                f"{' or '.join(CHECKPOINT_FORMATS)}, not {args.ckpt_format}")
        if ctx.backend.name == "cuda" and os.environ.get(CONNECTIONS) == "1":
            raise ArgumentError(f"--use-torch-fsdp2 on CUDA needs {CONNECTIONS} unset or greater than 1 "
                                f"(FSDP2 overlaps its collectives with compute); it is 1")
        from adaptor.fsdp2.config import Fsdp2ConfigError, config_from_args

        try:
            config_from_args(args)
        except Fsdp2ConfigError as exc:
            raise ArgumentError(str(exc)) from None
