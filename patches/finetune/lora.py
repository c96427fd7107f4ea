"""LoRA fine-tuning (MindSpeed-LLM's flags): adapters on Megatron's column- and row-parallel linears.

``--lora-target-modules`` (``linear_qkv linear_proj linear_fc1 linear_fc2``, MLA's ``linear_q_proj``,
``linear_q_down_proj``, ``linear_q_up_proj``, ``linear_kv_down_proj``, ``linear_kv_up_proj``) or
``--lora-r`` alone (then the four dense linears) turns LoRA on; defaults ``--lora-r 16 --lora-alpha 32
--lora-dropout 0`` as MindSpeed-LLM's. Each targeted linear computes ``base(x) + alpha/r * B(A(dropout(x)))``
(:mod:`adaptor.lora.layers`); everything else is frozen. The ``module_swaps`` build
``LoraColumnParallelLinear`` / ``LoraRowParallelLinear`` where the local spec names
``ColumnParallelLinear`` / ``RowParallelLinear``; an untargeted linear behaves as upstream's.

Upstream functions wrapped (each passes through without adapters):

* ``megatron.training.training.get_model``: builds the chunk with adapters drawn from ``--seed`` and
  the linear's place in the model (same adapters at every layout,
  :func:`adaptor.lora.model.initialize_adapters`) and freezes the rest before DDP wraps it, so only
  adapters get gradient buffers and optimizer state.
* ``megatron.training.checkpointing.load_checkpoint``: ``--load`` / ``--pretrained-checkpoint`` give
  the BASE model, read model-only at iteration 0; ``--ckpt-step`` applies to ``--lora-load``.
* ``megatron.training.training.setup_model_and_optimizer``: ``--lora-load DIR`` then loads the
  adapters with Megatron's resume semantics (a directory without a checkpoint starts fresh; a PEFT
  directory gives weights only, :func:`adaptor.convert.online.load_peft_lora`).
* ``megatron.training.checkpointing.generate_state_dict``: the model state is the adapters (or the
  base during ``--load``, :mod:`adaptor.lora.checkpoint`), so ``--save`` writes adapters only in
  ``torch``, ``torch_dist`` and ``safetensors``.
* ``megatron.core.dist_checkpointing.serialization.load``: adapters or base that do not fit the
  model end in one line naming the tensor and both shapes.
* ``megatron.core.transformer.multi_latent_attention.MLASelfAttention.__init__`` accepts only
  upstream's ``ColumnParallelLinear`` (an identity check); while it runs that name is the LoRA class.

``--lora-fusion`` is a speed hint without effect, ``--lora-ckpt-filter`` is what every save does,
``--lora-register-forward-hook`` is not needed; ``--lora-modules-to-save``, ``--qlora``,
``--qlora-save-dequantize`` are refused, as are with LoRA: Transformer Engine's spec, FSDP,
grouped-GEMM experts via ``linear_fc1``/``linear_fc2``, ``--ckpt-format torch_dcp|fsdp_dtensor``,
``--ckpt-convert-format``, ``--freeze-all-layers``. Exporters use :mod:`adaptor.lora.model`.
"""
from __future__ import annotations

import sys

from adaptor.features import ArgumentError, Feature
from adaptor.lora import DEFAULT_TARGETS, TARGETS
from adaptor.wrapping import argument, overridden
from adaptor.log import notice

OWNER = __name__
LINEAR_NAMES = tuple(TARGETS.values())
R_DEFAULT, ALPHA_DEFAULT = 16, 32.0  # MindSpeed-LLM's
# dest -> flag of the flags that need LoRA on to mean anything
NEEDS_LORA = {"lora_alpha": "--lora-alpha", "lora_dropout": "--lora-dropout", "lora_load": "--lora-load",
              "lora_fusion": "--lora-fusion", "lora_ckpt_filter": "--lora-ckpt-filter",
              "lora_register_forward_hook": "--lora-register-forward-hook"}


def _lora_on(ns) -> bool:
    """LoRA asked for on a command line: target modules, or a positive rank."""
    r = getattr(ns, "lora_r", None)
    return bool(getattr(ns, "lora_target_modules", None)) or (r is not None and r > 0)


def _active() -> bool:
    """This run has adapters (after set_defaults: a rank; None or 0 when LoRA is off)."""
    from megatron.training import get_args

    return bool(getattr(get_args(), "lora_r", None))


# ----------------------------------------------------------------------------- the model
def _get_model(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    from adaptor.lora import model as lora_model
    from adaptor.lora.checkpoint import after_load
    from adaptor.lora.layers import LoraConfig, building

    args = get_args()
    config = LoraConfig.from_args(args)
    if config is None:
        return wrapped(*call_args, **kwargs)
    provider = argument(call_args, kwargs, "model_provider_func")

    def provider_with_adapters(*a, **kw):
        with building(config):
            chunk = provider(*a, **kw)
        lora_model.initialize_adapters(chunk, args.seed)
        lora_model.freeze_all_but_adapters(chunk)
        lora_model.embedding_output_requires_grad(chunk)
        chunk.register_load_state_dict_post_hook(after_load)
        return chunk

    if "model_provider_func" in kwargs:
        kwargs = {**kwargs, "model_provider_func": provider_with_adapters}
    else:
        call_args = (provider_with_adapters, *call_args[1:])
    model = wrapped(*call_args, **kwargs)
    _report(model, config)
    return model


def _report(model, config) -> None:
    import torch
    from megatron.core import mpu

    from adaptor.errors import fail
    from adaptor.lora import model as lora_model

    present = lora_model.targets_present(model)
    buildable = {m.lora_module_name for m in _lora_linears(model) if m.lora_module_name}
    if torch.distributed.is_initialized():
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, (sorted(present), sorted(buildable)))
        present = set().union(*(set(p) for p, _ in gathered))
        buildable = set().union(*(set(b) for _, b in gathered))
    absent = [t for t in config.targets if t not in present]
    if absent:
        has = ", ".join(n for n in LINEAR_NAMES if n in buildable) or "none of them"
        fail(f"--lora-target-modules {absent[0]}: this model has no {absent[0]} linear "
             f"(its adaptable linears: {has})")
    if mpu.get_data_parallel_rank() != 0:
        return
    trainable, total = lora_model.parameter_counts(model)
    linears = len(lora_model.adapted_linears(model))
    print(f"> LoRA r={config.r} alpha={config.alpha:g} (scaling {config.scaling:g}) dropout={config.dropout:g} on "
          f"{', '.join(config.targets)}: {linears} adapted linears; {trainable:,} of {total:,} parameters train "
          f"({100.0 * trainable / max(total, 1):.2f}%) on (tensor, pipeline, expert) model parallel rank "
          f"({mpu.get_tensor_model_parallel_rank()}, {mpu.get_pipeline_model_parallel_rank()}, "
          f"{mpu.get_expert_model_parallel_rank()})", flush=True)


def _lora_linears(model):
    from megatron.core.utils import unwrap_model

    from adaptor.lora.layers import _LoraMixin

    return [m for chunk in unwrap_model(model) for m in chunk.modules() if isinstance(m, _LoraMixin)]


def _mla_init(wrapped, instance, call_args, kwargs):
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.transformer import multi_latent_attention as mla

    submodules = argument(call_args, kwargs, "submodules", 1)
    ours = [getattr(submodules, name, None) for name in ("linear_q_down_proj", "linear_kv_down_proj")]
    ours = [c for c in ours
            if isinstance(c, type) and issubclass(c, ColumnParallelLinear) and c is not ColumnParallelLinear]
    if not ours:
        return wrapped(*call_args, **kwargs)
    with overridden(mla, ColumnParallelLinear=ours[0]):
        return wrapped(*call_args, **kwargs)


# ----------------------------------------------------------------------------- checkpoints
def _where(args, mode: str) -> str:
    from adaptor.lora.checkpoint import ADAPTERS

    return f"--lora-load {args.lora_load}" if mode == ADAPTERS else f"--load {args.load}"


def _load_checkpoint(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    from adaptor.errors import fail
    from adaptor.lora import checkpoint

    args = get_args()
    if not _active():
        return wrapped(*call_args, **kwargs)
    load_arg = kwargs.get("load_arg", call_args[3] if len(call_args) > 3 else "load")
    if load_arg == "lora_load":
        mode, settings = checkpoint.ADAPTERS, {}
    elif load_arg == "load":
        mode = checkpoint.BASE
        settings = dict(finetune=True, no_load_optim=True, no_load_rng=True, ckpt_step=None)
    else:
        return wrapped(*call_args, **kwargs)
    if mode == checkpoint.BASE:
        notice("LoRA: --load gives the base model, its weights only (as --finetune --no-load-optim "
               "--no-load-rng); the adapters " + (f"come from --lora-load {args.lora_load}" if args.lora_load
                                                  else "start fresh"))
    try:
        with checkpoint.loading(mode), overridden(args, **settings):
            return wrapped(*call_args, **kwargs)
    except checkpoint.AdapterCheckpointError as exc:
        fail(f"{_where(args, mode)}: {exc}")


def _setup_model_and_optimizer(wrapped, instance, call_args, kwargs):
    from megatron.training import checkpointing, get_args

    model, optimizer, scheduler = wrapped(*call_args, **kwargs)
    args = get_args()
    if not _active():
        return model, optimizer, scheduler
    from adaptor.convert.lora import is_peft_adapter

    if args.lora_load and is_peft_adapter(args.lora_load):  # a PEFT directory: adaptor.convert.online
        from adaptor.convert.online import load_peft_lora

        load_peft_lora(model, optimizer, args)
    elif args.lora_load:
        args.iteration, args.num_floating_point_operations_so_far = checkpointing.load_checkpoint(
            model, optimizer, scheduler, load_arg="lora_load",
            checkpointing_context=kwargs.get("checkpointing_context"))
    return model, optimizer, scheduler


def _generate_state_dict(wrapped, instance, call_args, kwargs):
    from adaptor.lora import checkpoint

    if not _active():
        return wrapped(*call_args, **kwargs)
    mode = checkpoint.current() or checkpoint.ADAPTERS  # a save writes the adapters
    if "model" in kwargs:
        kwargs = {**kwargs, "model": checkpoint.views(kwargs["model"], mode)}
    else:
        call_args = (call_args[0], checkpoint.views(call_args[1], mode), *call_args[2:])
    return wrapped(*call_args, **kwargs)


def _dist_load(wrapped, instance, call_args, kwargs):
    from adaptor.errors import fail
    from adaptor.lora import checkpoint
    from adaptor.checkpoint.shapes import checkpoint_global_shapes

    mode = checkpoint.current()
    if mode is None:
        return wrapped(*call_args, **kwargs)
    from megatron.training import get_args

    sharded = argument(call_args, kwargs, "sharded_state_dict")
    directory = call_args[1] if len(call_args) > 1 else kwargs["checkpoint_dir"]
    try:
        checkpoint.check_load(sharded, checkpoint_global_shapes(directory), mode)
    except checkpoint.AdapterCheckpointError as exc:
        fail(f"{_where(get_args(), mode)}: {exc}")
    return wrapped(*call_args, **kwargs)


# ----------------------------------------------------------------------------- the feature
class Lora(Feature):
    name = "lora"
    module_swaps = (
        ("lora_r", "megatron.core.tensor_parallel.layers:ColumnParallelLinear",
         "adaptor.lora.layers:LoraColumnParallelLinear"),
        ("lora_r", "megatron.core.tensor_parallel.layers:RowParallelLinear",
         "adaptor.lora.layers:LoraRowParallelLinear"),
    )

    def add_arguments(self, group) -> None:
        group.add_argument("--lora-r", type=int, default=None, dest="lora_r", metavar="R",
                           help=f"LoRA rank (default {R_DEFAULT} when LoRA is on). Given alone, it turns LoRA on for "
                                f"{' '.join(DEFAULT_TARGETS)}.")
        group.add_argument("--lora-alpha", type=float, default=None, dest="lora_alpha", metavar="ALPHA",
                           help=f"LoRA alpha: the adapters' output is scaled by alpha / r (default {ALPHA_DEFAULT:g}).")
        group.add_argument("--lora-dropout", type=float, default=0.0, dest="lora_dropout", metavar="P",
                           help="Dropout on the adapters' input (default 0).")
        group.add_argument("--lora-target-modules", nargs="+", default=[], dest="lora_target_modules",
                           metavar="NAME",
                           help="Turn LoRA on for these linears: " + ", ".join(LINEAR_NAMES)
                                + " (the last five are MLA's); everything else is frozen.")
        group.add_argument("--lora-load", default=None, dest="lora_load", metavar="DIR",
                           help="Load the adapters, their optimizer state, scheduler, RNG and iteration from this "
                                "checkpoint directory (a LoRA run's --save); --load gives the base model.")
        group.add_argument("--lora-fusion", action="store_true", dest="lora_fusion",
                           help="MindSpeed-LLM's fused LoRA kernels: accepted as a speed hint, without effect here.")
        group.add_argument("--lora-ckpt-filter", action="store_true", dest="lora_ckpt_filter",
                           help="Save only the adapters: what every LoRA save does here.")
        group.add_argument("--lora-register-forward-hook", nargs="+", default=None,
                           dest="lora_register_forward_hook", metavar="NAME",
                           help="Accepted, not needed: the frozen embedding's output always asks for a gradient.")
        group.add_argument("--lora-modules-to-save", nargs="+", default=None, dest="lora_modules_to_save",
                           metavar="NAME", help="Not supported (refused): only the adapters train and are saved.")
        group.add_argument("--qlora", action="store_true", dest="qlora",
                           help="Not supported (refused): 4-bit quantized base weights.")
        group.add_argument("--qlora-save-dequantize", action="store_true", dest="qlora_save_dequantize",
                           help="Not supported (refused), as --qlora.")

    def enabled(self, ctx) -> bool:
        argv = ctx.argv if ctx.argv is not None else sys.argv[1:]
        return super().enabled(ctx) and any(a.startswith(("--lora-", "--qlora")) for a in argv)

    def register_patches(self, pm, ctx) -> None:
        # Enabled by any --lora-*/--qlora* flag; each wrapper passes through when the run has no adapters.
        pm.register_wrapper("megatron.training.training.get_model", _get_model, OWNER)
        pm.register_wrapper("megatron.training.training.setup_model_and_optimizer", _setup_model_and_optimizer, OWNER)
        pm.register_wrapper("megatron.training.checkpointing.load_checkpoint", _load_checkpoint, OWNER)
        pm.register_wrapper("megatron.training.checkpointing.generate_state_dict", _generate_state_dict, OWNER)
        pm.register_wrapper("megatron.core.dist_checkpointing.serialization.load", _dist_load, OWNER)
        pm.register_wrapper("megatron.core.transformer.multi_latent_attention.MLASelfAttention.__init__",
                            _mla_init, OWNER)

    def set_defaults(self, args, ctx) -> None:
        if not _lora_on(args):
            return
        from adaptor.log import notice_once

        if args.lora_r is None:
            args.lora_r = R_DEFAULT
        if args.lora_alpha is None:
            args.lora_alpha = ALPHA_DEFAULT
        args.lora_target_modules = list(dict.fromkeys(args.lora_target_modules or DEFAULT_TARGETS))
        if args.transformer_impl == "transformer_engine" and "transformer_impl" not in ctx.explicit:
            args.transformer_impl = "local"
            notice_once("LoRA: --transformer-impl local (the adapters are on megatron-core's own linears)")

    def validate(self, args, ctx) -> None:
        from adaptor.log import notice_once

        if args.qlora or args.qlora_save_dequantize:
            flag = "--qlora" if args.qlora else "--qlora-save-dequantize"
            raise ArgumentError(f"{flag}: 4-bit quantized base weights (QLoRA) are not supported; drop it (LoRA on "
                                f"the --bf16 or fp32 base trains the same kind of adapters)")
        if args.lora_modules_to_save:
            raise ArgumentError("--lora-modules-to-save: only the adapters train and are saved here; drop it")
        if not _lora_on(args):
            given = [flag for dest, flag in NEEDS_LORA.items() if dest in ctx.explicit]
            if given:
                raise ArgumentError(f"{given[0]} needs LoRA layers: add --lora-target-modules "
                                    f"{' '.join(DEFAULT_TARGETS)} (or --lora-r R)")
            return
        self._validate_values(args)
        self._validate_targets(args)
        self._validate_combinations(args)
        if args.lora_load:
            from adaptor.preflight.checkpoint_dirs import check_load_dir

            check_load_dir(args.lora_load, "--lora-load")
            if getattr(args, "finetune", False):
                notice_once("--finetune applies to --lora-load (--load always gives the base model weights only): "
                            "the adapters load without their optimizer state, and training starts at iteration 0")
        if args.lora_fusion:
            notice_once("--lora-fusion: a speed hint for MindSpeed's fused LoRA kernels; the adapters run as two "
                        "small matmuls here, so it changes nothing")

    @staticmethod
    def _validate_values(args) -> None:
        if args.lora_r < 1:
            raise ArgumentError(f"--lora-r must be at least 1 (got {args.lora_r})")
        if args.lora_alpha <= 0:
            raise ArgumentError(f"--lora-alpha must be positive (got {args.lora_alpha:g})")
        if not 0.0 <= args.lora_dropout < 1.0:
            raise ArgumentError(f"--lora-dropout is a probability in [0, 1) (got {args.lora_dropout:g})")

    @staticmethod
    def _validate_targets(args) -> None:
        for name in args.lora_target_modules:
            if name not in LINEAR_NAMES:
                raise ArgumentError(f"--lora-target-modules {name}: not a linear LoRA adapts here; choose from "
                                    f"{', '.join(LINEAR_NAMES)}")
        mla = bool(getattr(args, "multi_latent_attention", False))
        q_lora = getattr(args, "q_lora_rank", None) is not None
        why = {
            "linear_qkv": ("MLA models (--multi-latent-attention) have linear_q_* and linear_kv_* instead"
                           if mla else None),
            "linear_q_proj": None if mla and not q_lora else
            ("it is MLA's query projection without --q-lora-rank" if mla else "it is an MLA linear"),
            "linear_q_down_proj": None if mla and q_lora else
            ("it is MLA's with --q-lora-rank" if mla else "it is an MLA linear"),
        }
        why["linear_q_up_proj"] = why["linear_q_down_proj"]
        why["linear_kv_down_proj"] = why["linear_kv_up_proj"] = None if mla else "it is an MLA linear"
        for name in args.lora_target_modules:
            if why.get(name):
                raise ArgumentError(f"--lora-target-modules {name}: this model has no {name} ({why[name]})")

    @staticmethod
    def _validate_combinations(args) -> None:
        targets = set(args.lora_target_modules)
        if args.transformer_impl == "transformer_engine":
            raise ArgumentError("LoRA adapts megatron-core's own linears; Transformer Engine's are not adapted: "
                                "use --transformer-impl local")
        for dest, flag in (("use_torch_fsdp2", "--use-torch-fsdp2"), ("use_megatron_fsdp", "--use-megatron-fsdp")):
            if getattr(args, dest, False):
                raise ArgumentError(f"LoRA is not supported with {flag}: train the adapters with Megatron's DDP "
                                    f"(optionally --use-distributed-optimizer)")
        if getattr(args, "num_experts", None) and getattr(args, "moe_grouped_gemm", False) \
                and targets & {"linear_fc1", "linear_fc2"}:
            raise ArgumentError("LoRA on linear_fc1/linear_fc2 of MoE experts needs SequentialMLP experts: drop "
                                "--moe-grouped-gemm (or target only attention linears)")
        if getattr(args, "ckpt_format", None) in ("torch_dcp", "fsdp_dtensor"):
            raise ArgumentError(f"LoRA saves adapter-only checkpoints as safetensors, torch_dist or torch; "
                                f"--ckpt-format {args.ckpt_format} is not supported with it")
        if getattr(args, "ckpt_convert_format", None):
            raise ArgumentError("--ckpt-convert-format converts a whole model; with LoRA only the adapters are "
                                "checkpointed: drop it")
        if getattr(args, "freeze_all_layers", False):
            raise ArgumentError("--freeze-all-layers would freeze the adapters too; LoRA already freezes the base "
                                "model: drop it")
