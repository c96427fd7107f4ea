"""``--use-torch-fsdp2`` (Megatron's flag) on NPU, GPU and CPU, configured by ``--fsdp2-config-path``.

Upstream code changed, and why:

* ``megatron.core.distributed.torch_fully_sharded_data_parallel.TorchFullyShardedDataParallel`` is
  replaced (every alias) by :class:`adaptor.fsdp2.wrapper.FullyShardedModel`: upstream's mesh is
  "cuda" only and it shards fixed classes; ours uses the backend's device, the YAML plan and fp32
  master weights under ``--bf16`` and ``--fp16``.
* ``megatron.training.arguments.validate_args`` asserts untied embeddings, ``--ckpt-format
  torch_dist|torch_dcp`` (safetensors saves FSDP2 too; torch_dcp's own limits are checked in
  :mod:`adaptor.preflight.parallel_layout`) and ``CUDA_DEVICE_MAX_CONNECTIONS`` != 1, none
  fundamental here; the replacement runs the original with accepted values and restores them, after
  :meth:`TorchFsdp2.validate` has refused the real limits (PP, EP, distributed optimizer,
  gradient-accumulation fusion) in one line. It also asserts ``not args.fp16``; ``--fp16`` is passed
  to it turned off (with the two flags whose checks read it) and its effects (``params_dtype`` half,
  no NaN check under dynamic loss scaling) are applied after it.
* ``megatron.training.training.get_megatron_ddp_config``: carries the checked plan to the wrapper.
* ``megatron.core.utils.get_data_parallel_group_if_dtensor`` returns None for a plain tensor, so the
  last gradient decides whether ``optimizer.clip_grads`` sums over data-parallel ranks; with
  ``ignored_modules`` ranks disagree and hang. A plain tensor now keeps the group found so far.
* ``megatron.training.training.get_megatron_optimizer_config``: sharded parameters are already fp32
  masters, so bf16 and fp16 are turned off there and Megatron builds its plain ``FP32Optimizer``.
* ``megatron.core.optimizer._get_megatron_optimizer_based_on_param_groups``: under ``--fp16`` that
  ``FP32Optimizer`` becomes :class:`adaptor.fsdp2.loss_scaling.LossScaledFP32Optimizer`, with the grad
  scaler Megatron builds there for fp16 (upstream gives ``FP32Optimizer`` none, and FSDP2 gradients
  need the inf/NaN check reduced over every rank).

Checkpoint fixes: :mod:`patches.fsdp2.sharded_checkpoint`.

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
CHECKPOINT_FORMATS = ("torch_dist", "safetensors", "torch_dcp")
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


def _lenient_validate_args(original, backend: str):
    def validate_args(args, defaults={}):  # noqa: B006  (Megatron's signature)
        if not getattr(args, "use_torch_fsdp2", False):
            return original(args, defaults)
        ckpt_format = args.ckpt_format if args.ckpt_format in ("torch_dist", "torch_dcp") else "torch_dist"
        connections = os.environ.pop(CONNECTIONS, None) if backend != "cuda" else None
        fp16 = bool(args.fp16)
        if fp16 and args.bf16:
            raise AssertionError("--fp16 and --bf16 are mutually exclusive")
        # Upstream asserts "not args.fp16" under --use-torch-fsdp2; the other checks that read
        # --fp16 elsewhere in validate_args are passed with it off and their effects redone below.
        fp16_off = dict(fp16=False, fp16_lm_cross_entropy=False, fp32_residual_connection=False) if fp16 else {}
        try:
            with overridden(args, untie_embeddings_and_output_weights=True, ckpt_format=ckpt_format, **fp16_off):
                result = original(args, defaults)
        finally:
            if connections is not None:
                os.environ[CONNECTIONS] = connections
        if fp16:
            _fp16_arguments(args)
        return result

    return validate_args


def _fp16_arguments(args) -> None:
    """What ``validate_args`` does for ``--fp16`` (megatron-core 0.19.2, arguments.py 1170-1178)."""
    args.params_dtype = torch.half
    if not args.loss_scale:
        # dynamic loss scaling: an inf/NaN gradient is the scaler's signal, not an error
        args.check_for_nan_in_loss_and_grad = False
        if getattr(args, "rank", 0) == 0:
            print("WARNING: Setting args.check_for_nan_in_loss_and_grad to False since dynamic loss scaling "
                  "is being used", flush=True)


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
        config.fsdp2_loss_scaling = bool(args.fp16)  # read by _loss_scaled_optimizer
    return config, overrides


def _loss_scaled_optimizer(wrapped, instance, call_args, kwargs):
    from megatron.core.optimizer.optimizer import FP32Optimizer

    from adaptor.fsdp2.loss_scaling import LossScaledFP32Optimizer, grad_scaler_from_config

    optimizer = wrapped(*call_args, **kwargs)
    config = argument(call_args, kwargs, "config")
    if getattr(config, "fsdp2_loss_scaling", False) and type(optimizer) is FP32Optimizer:
        return LossScaledFP32Optimizer.from_fp32(optimizer, grad_scaler_from_config(config))
    return optimizer


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
        pm.register_wrapper("megatron.core.optimizer._get_megatron_optimizer_based_on_param_groups",
                            _loss_scaled_optimizer, OWNER)
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
            (getattr(args, "init_model_with_meta_device", False), "--init-model-with-meta-device"),
        ]
        for bad, what in unsupported:
            if bad:
                raise ArgumentError(f"--use-torch-fsdp2 does not support {what}")
        if (args.save or args.load) and args.ckpt_format not in CHECKPOINT_FORMATS:
            raise ArgumentError(f"--use-torch-fsdp2 saves and loads checkpoints as --ckpt-format "
                                f"{', '.join(CHECKPOINT_FORMATS[:-1])} or {CHECKPOINT_FORMATS[-1]}, "
                                f"not {args.ckpt_format}")
        if ctx.backend.name == "cuda" and os.environ.get(CONNECTIONS) == "1":
            raise ArgumentError(f"--use-torch-fsdp2 on CUDA needs {CONNECTIONS} unset or greater than 1 "
                                f"(FSDP2 overlaps its collectives with compute); it is 1")
        from adaptor.fsdp2.config import Fsdp2ConfigError, config_from_args

        try:
            config_from_args(args)
        except Fsdp2ConfigError as exc:
            raise ArgumentError(str(exc)) from None
