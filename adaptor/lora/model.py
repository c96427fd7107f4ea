"""A model with LoRA adapters: what trains, what its adapted linears are, and their merged weights.

For exporters, on each rank: :func:`adapted_linears` gives ``{state-dict prefix: linear}`` of the
linears that carry adapters (``linear.lora_A.weight`` / ``linear.lora_B.weight``, ``linear.lora_scaling``,
``linear.lora_delta()`` = ``scaling * B @ A`` in the local shape of ``linear.weight``: rows of a
column-parallel weight, columns of a row-parallel one, as the base weight is split); :func:`merged`
adds every delta into its base weight for the duration of a block.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from adaptor.lora import is_lora_name


def _chunks(model) -> list:
    """The bare model chunks (without Megatron's DDP / Float16Module wrappers)."""
    from megatron.core.utils import unwrap_model

    return unwrap_model(model if isinstance(model, list) else [model])


def adapted_linears(model) -> dict:
    """``{name: linear}`` for every linear with adapters, over all model chunks (a prefix per chunk when
    there are several: ``model1.decoder...``)."""
    from adaptor.lora.layers import _LoraMixin

    chunks = _chunks(model)
    found = {}
    for index, chunk in enumerate(chunks):
        prefix = f"model{index}." if len(chunks) > 1 else ""
        for name, module in chunk.named_modules():
            if isinstance(module, _LoraMixin) and module.has_adapters:
                found[prefix + name] = module
    return found


@contextlib.contextmanager
def merged(model) -> Iterator[None]:
    """Every adapter added into its base weight inside the block (forward then equals the unmerged one)."""
    linears = list(adapted_linears(model).values())
    for linear in linears:
        linear.merge_()
    try:
        yield
    finally:
        for linear in linears:
            linear.unmerge_()


def layout_free_name(chunk: torch.nn.Module, name: str) -> str:
    """``name`` of a submodule of ``chunk`` with this rank's indices made global: a transformer (or MTP)
    layer by its ``layer_number``, a local expert by its index among all experts. The same linear has the
    same such name under every TP/PP/VPP/EP layout."""
    parts = name.split(".")
    out, module = [], chunk
    for i, part in enumerate(parts):
        module = getattr(module, part)
        if part.isdigit() and getattr(module, "layer_number", None) is not None:
            part = f"layer{module.layer_number}"
        elif part.isdigit() and i and parts[i - 1] == "local_experts":
            experts = chunk.get_submodule(".".join(parts[:i - 1]))
            group = getattr(experts, "ep_group", None)
            offset = group.rank() * experts.num_local_experts if group is not None else 0
            part = f"expert{offset + int(part)}"
        out.append(part)
    return ".".join(out)


def initialize_adapters(chunk: torch.nn.Module, seed: int) -> None:
    """Redraw every adapter of ``chunk`` (A: PEFT's kaiming-uniform, B: zeros) from a CPU generator keyed by
    ``seed`` and the linear's :func:`layout_free_name`."""
    import hashlib

    from adaptor.lora.layers import _LoraMixin

    for name, module in chunk.named_modules():
        if isinstance(module, _LoraMixin) and module.has_adapters:
            key = f"{seed}:{layout_free_name(chunk, name)}"
            digest = hashlib.sha256(key.encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
            module.reset_adapters(generator)


def freeze_all_but_adapters(module: torch.nn.Module) -> None:
    """Only adapter parameters learn; routers stop moving their expert bias (a base-model state
    the adapter checkpoint does not hold)."""
    for name, param in module.named_parameters():
        param.requires_grad_(is_lora_name(name))
    for sub in module.modules():
        if hasattr(sub, "frozen_expert_bias"):
            sub.frozen_expert_bias = True


def _require_grad(module, inputs, output):
    if isinstance(output, torch.Tensor) and not output.requires_grad and output.is_floating_point():
        output.requires_grad_(True)
    return output


def embedding_output_requires_grad(module: torch.nn.Module) -> None:
    """The frozen embedding's output asks for a gradient, so a first layer recomputed in backward (full
    recompute checkpoints its input) still passes gradients to its adapters."""
    embedding = getattr(module, "embedding", None)
    if embedding is not None:
        embedding.register_forward_hook(_require_grad)


def parameter_counts(model) -> tuple[int, int]:
    """(trainable, total) parameter elements of this rank's model chunks."""
    params = [p for chunk in _chunks(model) for p in chunk.parameters()]
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def targets_present(model) -> set[str]:
    """The ``--lora-target-modules`` names that got adapters on this rank."""
    return {linear.lora_target for linear in adapted_linears(model).values()}
