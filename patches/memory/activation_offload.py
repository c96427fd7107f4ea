"""``--fine-grained-activation-offloading`` (Megatron's) and ``--swap-attention`` (MindSpeed's) on the local spec.

Both move what chosen modules save for backward to host memory through
:mod:`adaptor.memory.activation_offload` (saved-tensor hooks, any backend). Upstream code changed:

* Megatron's ``megatron.core.pipeline_parallel.fine_grained_activation_offload`` needs CUDA streams
  and Transformer Engine (``megatron.training.arguments.validate_args`` asserts it). Off TE,
  :meth:`ActivationOffload.set_defaults` moves the request to ``args.activation_offload_modules``
  and sets ``args.fine_grained_activation_offloading`` back to False so none of Megatron's
  offloading runs; with TE, Megatron's runs.
* ``megatron.core.transformer.transformer_block.TransformerBlock.__init__`` (wrapped): forward hooks
  on the chosen submodules open and close the offload scope, one on the block starts a pass. The
  experts' activation (``moe_act``) runs inline in ``MLP.forward``, so its scope opens when an
  expert's ``linear_fc1`` returns and closes when its ``linear_fc2`` starts; the grouped experts of
  ``--moe-grouped-gemm`` run their linears as modules too (``adaptor.ops.grouped_matmul``).
* ``megatron.training.training.train_step`` (wrapped): after the first step rank 0 logs the bytes
  offloaded per module.

A recomputed module saves only its checkpoint inputs (offloaded when inside an offloaded module);
the recomputation in backward offloads nothing.
"""
from __future__ import annotations

from adaptor import log
from adaptor.features import ArgumentError, Feature

OWNER = __name__

#: Megatron's --offload-modules names -> submodule paths in a TransformerLayer (the first that exist).
MODULES = {
    "attn_norm": ("input_layernorm",),
    "qkv_linear": ("self_attention.linear_qkv", "self_attention.linear_q_proj", "self_attention.linear_q_down_proj",
                   "self_attention.linear_q_up_proj", "self_attention.linear_kv_down_proj",
                   "self_attention.linear_kv_up_proj"),
    "core_attn": ("self_attention.core_attention",),
    "attn_proj": ("self_attention.linear_proj",),
    "mlp_norm": ("pre_mlp_layernorm",),
    # the grouped experts' fc1 (adaptor.ops.grouped_matmul, --moe-grouped-gemm), else each expert's
    "expert_fc1": ("mlp.experts._proxy.linear_fc1", "mlp.experts.local_experts.*.linear_fc1"),
    # the experts' activation: what MLP.forward runs between an expert MLP's linear_fc1 and linear_fc2
    "moe_act": ("mlp.experts._proxy", "mlp.experts.local_experts.*"),
    # MindSpeed's --swap-modules names.
    "input_norm": ("input_layernorm",),
    "self_attention": ("self_attention",),
    "post_attention_norm": ("pre_mlp_layernorm",),
}
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
#: names whose every path is attached (the others: the first path that exists)
EVERY_PATH = ("qkv_linear", "expert_fc1", "moe_act")
REFUSED_MODULES = {
    "fused_group_mlp": "it is Transformer Engine's fused grouped MLP (--use-transformer-engine-op-fuser)",
}
SWAP_MODULES = ("input_norm", "self_attention", "post_attention_norm")
SWAP_DEFAULT = "self_attention"  # MindSpeed's default on megatron-core layers

_settings: dict = {}  # modules and min size of this run, set while the arguments are checked
_offloader = None


def offloader():
    """This process's offloader (one for every layer), made when the first layers are built."""
    global _offloader
    if _offloader is None:
        from adaptor import run_state
        from adaptor.memory.activation_offload import ActivationOffloader

        _offloader = ActivationOffloader(run_state.backend().device_type, _settings["min_numel"])
        log.notice_once(_offloader.describe())
    return _offloader


def _submodules(layer, path: str):
    found = [layer]
    for part in path.split("."):
        found = [child for mod in found
                 for child in (list(mod.children()) if part == "*" else [getattr(mod, part, None)])
                 if child is not None]
    return found


def attach_to_layer(layer, modules, offl) -> None:
    """Offload the saved tensors of ``modules`` (names of :data:`MODULES`) of one TransformerLayer."""
    from megatron.core.transformer.identity_op import IdentityOp

    from adaptor.memory.activation_offload import attach, attach_between

    # in MODULES' order, whatever the command line's: expert_fc1's scope closes before moe_act's opens
    for name in [n for n in MODULES if n in modules]:
        for path in MODULES[name]:
            targets = [m for m in _submodules(layer, path) if not isinstance(m, IdentityOp)]
            for module in targets:
                if name == "moe_act":
                    attach_between(module.linear_fc1, module.linear_fc2, name, offl)
                else:
                    attach(module, name, offl)
            if targets and name not in EVERY_PATH:
                break


def _attach_to_block(wrapped, instance, call_args, kwargs):
    result = wrapped(*call_args, **kwargs)
    if _settings.get("modules"):
        from adaptor.memory.activation_offload import attach_pass_start

        offl = offloader()
        attach_pass_start(instance, offl)
        for layer in instance.layers:
            attach_to_layer(layer, _settings["modules"], offl)
    return result


def _summary_after_first_step(wrapped, instance, call_args, kwargs):
    result = wrapped(*call_args, **kwargs)
    if _offloader is not None:
        log.notice_once(_offloader.summary(), key="activation offload summary")
    return result


def _names(value) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    return [n.strip() for item in items for n in str(item).split(",") if n.strip()]


class ActivationOffload(Feature):
    name = "activation_offload"
    upstream_flags = ("--fine-grained-activation-offloading",)

    def add_arguments(self, group) -> None:
        group.add_argument("--swap-attention", action="store_true", dest="swap_attention",
                           help="MindSpeed's spelling: offload what --swap-modules save in forward to host "
                                "memory (Megatron's --fine-grained-activation-offloading mechanism).")
        group.add_argument("--swap-modules", default=None, dest="swap_modules", metavar="NAMES",
                           help=f"Comma-separated, with --swap-attention: {', '.join(SWAP_MODULES)} "
                                f"(default {SWAP_DEFAULT}).")

    def enabled(self, ctx) -> bool:
        flags = ctx.flags
        return super().enabled(ctx) and bool(getattr(flags, "fine_grained_activation_offloading", False)
                                             or flags.swap_attention or flags.swap_modules)

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.core.transformer.transformer_block.TransformerBlock.__init__",
                            _attach_to_block, OWNER)
        pm.register_wrapper("megatron.training.training.train_step", _summary_after_first_step, OWNER)

    def set_defaults(self, args, ctx) -> None:
        args.activation_offload_takeover = bool(args.fine_grained_activation_offloading
                                                and args.transformer_impl != "transformer_engine")
        if args.activation_offload_takeover:
            args.fine_grained_activation_offloading = False  # Megatron's TE/CUDA paths stay off

    def validate(self, args, ctx) -> None:
        if args.swap_modules and not args.swap_attention:
            raise ArgumentError("--swap-modules needs --swap-attention")
        if args.min_offloaded_tensor_size < 0:
            raise ArgumentError(f"--min-offloaded-tensor-size must be >= 0 elements, "
                                f"not {args.min_offloaded_tensor_size}")
        offload = _names(args.offload_modules) if args.activation_offload_takeover else []
        if args.activation_offload_takeover and not offload:
            raise ArgumentError("--fine-grained-activation-offloading needs --offload-modules "
                                f"(one or more of {', '.join(OFFLOAD_MODULES)})")
        for name in offload:
            if name in REFUSED_MODULES:
                raise ArgumentError(f"--offload-modules {name} is not available without Transformer Engine: "
                                    f"{REFUSED_MODULES[name]}")
            if name not in OFFLOAD_MODULES:
                raise ArgumentError(f"--offload-modules: unknown module {name!r}; "
                                    f"choose from {', '.join(OFFLOAD_MODULES)}")
        swap = (_names(args.swap_modules) or [SWAP_DEFAULT]) if args.swap_attention else []
        for name in swap:
            if name not in SWAP_MODULES:
                raise ArgumentError(f"--swap-modules: unknown module {name!r}; choose from {', '.join(SWAP_MODULES)}")
        if swap and args.fine_grained_activation_offloading:
            raise ArgumentError("--swap-attention and Transformer Engine's --fine-grained-activation-offloading "
                                "both offload activations; drop one")
        if swap:
            log.notice_once(f"--swap-attention: what {', '.join(swap)} save in forward is offloaded to host "
                            "memory (the fine-grained activation offloading mechanism)")
        _settings.update(modules=offload + [n for n in swap if n not in offload],
                         min_numel=args.min_offloaded_tensor_size)
