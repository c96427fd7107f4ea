"""Recompute inside a transformer layer: which layers, and the activation function of the MLP.

Megatron's ``tensor_parallel.CheckpointWithoutOutput`` (upstream's ``--recompute-modules layernorm``,
``moe_act``, ``mla_up_proj``) also serves MindSpeed's ``--recompute-norm`` and
``--recompute-activation-function``. Two upstream details need Transformer Engine:
``CheckpointWithoutOutput.__init__`` sets ``fp8 = fp8 is not None``, so ``fp8=False`` takes the FP8
path (:func:`fp8_only_when_asked`); and the recompute restores data through a C++ extension compiled
at first use (:func:`storage_copier` copies into the freed storage instead, as megatron-core did).

Layer choice, MindSpeed's rule, counted per pipeline stage: with ``--recompute-granularity full
--recompute-method block`` the first ``recompute_num_layers`` are recomputed whole and the next ``N``
(or all the rest) take the finer recompute; without full recompute, the first ``N`` (or all).
"""
from __future__ import annotations

import torch

#: Set on an MLP (or megatron-core's stand-in for one) whose activation is recomputed.
RECOMPUTE_ACTIVATION = "recompute_activation"


# -- upstream fixes ---------------------------------------------------------------------------

def fp8_only_when_asked(wrapped, instance, call_args, kwargs):
    """``CheckpointWithoutOutput(fp8=...)``: the FP8 path only for an FP8 run."""
    wrapped(*call_args, **kwargs)
    fp8 = kwargs.get("fp8", call_args[0] if call_args else False)
    instance.fp8 = bool(fp8)


def _copy_storage(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Give ``dst``'s freed storage ``src``'s bytes: every view of that storage sees them."""
    storage = dst.untyped_storage()
    storage.resize_(src.untyped_storage().nbytes())
    with torch.no_grad():
        storage.copy_(src.untyped_storage())


def storage_copier():
    """Stands for ``random._get_share_storage``: the function that refills a freed output."""
    return _copy_storage


# -- which layers ------------------------------------------------------------------------------

def chosen(index: int, count: int | None, full_layers: int) -> bool:
    """Whether the layer at ``index`` in its stage takes the finer recompute (MindSpeed's rule)."""
    if index < full_layers:
        return False
    return count is None or index < full_layers + count


def full_block_layers(config) -> int:
    """Layers per stage that ``--recompute-granularity full --recompute-method block`` recomputes whole."""
    if config.recompute_granularity == "full" and config.recompute_method == "block":
        return config.recompute_num_layers or 0
    return 0


def _mlps(module):
    """The MLPs whose activation runs in megatron-core's ``MLP.forward``: dense, expert or shared."""
    from megatron.core.transformer.mlp import MLP

    found = [m for m in module.modules() if isinstance(m, MLP)]
    proxy = getattr(module, "_proxy", None)  # adaptor.ops.grouped_matmul's grouped experts
    return found + ([proxy] if proxy is not None else [])


def mark_layers(layers, config) -> None:
    """Turn on, per layer of one stage, the recomputes asked for (called once the block is built)."""
    from megatron.core.transformer.identity_op import IdentityOp

    full = full_block_layers(config)
    moe_act = config.recompute_granularity == "selective" and "moe_act" in (config.recompute_modules or ())
    for index, layer in enumerate(layers):
        if getattr(config, "recompute_norm", False) and chosen(index, config.recompute_norm_num_layers, full):
            layer.recompute_input_layernorm = not isinstance(layer.input_layernorm, IdentityOp)
            layer.recompute_pre_mlp_layernorm = not isinstance(layer.pre_mlp_layernorm, IdentityOp)
        targets = []
        if getattr(config, "recompute_activation_function", False) and chosen(
                index, config.recompute_activation_function_num_layers, full):
            if not getattr(layer, "recompute_mlp", False):  # a checkpointed MLP recomputes it anyway
                targets += _mlps(layer.mlp)
        experts = getattr(layer.mlp, "experts", None)
        if moe_act and experts is not None:
            targets += _mlps(experts)
        for mlp in targets:
            object.__setattr__(mlp, RECOMPUTE_ACTIVATION, True)


def build_layers_then_mark(wrapped, instance, call_args, kwargs):
    """``TransformerBlock._build_layers``, then :func:`mark_layers` on the stage's layers."""
    result = wrapped(*call_args, **kwargs)
    mark_layers(instance.layers, instance.config)
    return result


# -- the activation of an MLP ------------------------------------------------------------------

class _PassThrough(torch.nn.Module):
    """Stands for a linear in ``MLP.forward``: returns its input, and the bias it was given."""

    def __init__(self):
        super().__init__()
        self.bias = None

    def forward(self, x):
        return x, self.bias


class _ActivationOnly(torch.nn.Module):
    """What ``MLP.forward`` reads from an MLP, with pass-through linears: it computes the activation only."""

    def __init__(self, mlp, mlp_forward):
        super().__init__()
        self.config = mlp.config
        object.__setattr__(self, "activation_func", mlp.activation_func)
        self.linear_fc1, self.linear_fc2 = _PassThrough(), _PassThrough()
        object.__setattr__(self, "_mlp_forward", mlp_forward)

    def forward(self, fc1_output, fc1_bias, per_token_scale):
        self.linear_fc1.bias = fc1_bias
        try:
            return self._mlp_forward(self, fc1_output, per_token_scale)[0]
        finally:
            self.linear_fc1.bias = None


def mlp_forward(wrapped, instance, call_args, kwargs):
    """``MLP.forward``; for a marked MLP, fc1 -> activation (output dropped, recomputed) -> fc2."""
    if instance is None:  # called through the class, as MLP.forward(mlp, ...)
        instance, call_args, function = call_args[0], call_args[1:], wrapped
    else:
        function = wrapped.__func__
    if not getattr(instance, RECOMPUTE_ACTIVATION, False) or not torch.is_grad_enabled():
        return function(instance, *call_args, **kwargs)
    from megatron.core.tensor_parallel import CheckpointWithoutOutput

    hidden_states = call_args[0] if call_args else kwargs["hidden_states"]
    per_token_scale = call_args[1] if len(call_args) > 1 else kwargs.get("per_token_scale")
    fc1_output, fc1_bias = instance.linear_fc1(hidden_states)
    activation = _ActivationOnly(instance, function)
    checkpoint = CheckpointWithoutOutput()
    intermediate = checkpoint.checkpoint(activation, fc1_output, fc1_bias, per_token_scale)
    output, output_bias = instance.linear_fc2(intermediate)
    checkpoint.discard_output_and_register_recompute(output)
    if per_token_scale is not None and output_bias is not None:  # as upstream: an expert adds its bias here
        output = output + output_bias.unsqueeze(0) * per_token_scale.unsqueeze(-1)
        output_bias = None
    return output, output_bias
