"""DPO's reference model: the policy's starting weights, frozen, evaluated under ``no_grad``.

* Full fine-tuning: :class:`FrozenReference` builds a second model of the same layout with the entry
  file's model provider (so it is split over TP ranks, pipeline stages and virtual stages exactly like
  the policy, one chunk per policy chunk) and copies the policy's weights into it before the first
  optimizer step, or loads ``--ref-model``. It is a plain module: not
  wrapped by DDP, absent from the optimizer, so data parallelism and the distributed optimizer never see
  it; every rank holds the same share of it as of the policy.
* LoRA: the reference is the policy with its adapters switched off (:func:`adapters_disabled`), which
  is the starting model whatever the adapters have learnt; nothing is copied.
"""
from __future__ import annotations

import contextlib
import copy
import os
from typing import Callable, Iterator, Optional

import torch


def bare(model) -> torch.nn.Module:
    """The GPTModel inside Megatron's DDP / Float16Module wrappers."""
    from megatron.core.utils import unwrap_model

    return unwrap_model(model)


@contextlib.contextmanager
def adapters_disabled(model) -> Iterator[None]:
    """Every LoRA linear of ``model`` computes its base projection only, inside the block."""
    from adaptor.lora.layers import _LoraMixin

    linears = [m for m in bare(model).modules() if isinstance(m, _LoraMixin) and m.has_adapters]
    for linear in linears:
        linear.lora_disabled = True
    try:
        yield
    finally:
        for linear in linears:
            linear.lora_disabled = False


class FrozenReference:
    """A frozen copy of the policy's model chunks, made on first use (see module doc)."""

    def __init__(self, build: Callable[[object, Optional[int]], torch.nn.Module],
                 load: Optional[Callable] = None) -> None:
        """``build(config, vp_stage)`` returns a fresh model chunk of the policy's layout; ``load(modules)``
        fills the chunks from ``--ref-model`` (None: copy the policy)."""
        self._build, self._load = build, load
        self.modules: Optional[list] = None

    def get(self, policy: list) -> list:
        """The reference's chunks, one per chunk of ``policy`` (a list of model chunks)."""
        if self.modules is None:
            self.modules = self._make([bare(chunk) for chunk in policy])
        return self.modules

    def release(self) -> None:
        """Drop the copy (a later :meth:`get` would make it again)."""
        self.modules = None

    def _make(self, policy: list) -> list:
        modules = []
        for chunk in policy:
            config = copy.copy(chunk.config)
            config.perform_initialization = False  # every weight is overwritten below
            module = self._build(config, getattr(chunk, "vp_stage", None))
            module.to(device=next(chunk.parameters()).device)
            modules.append(module)
        if self._load is not None:
            self._load(modules)
        else:
            for chunk, module in zip(policy, modules):
                missing, unexpected = bare(module).load_state_dict(chunk.state_dict(), strict=False)
                missing = [k for k in missing if not k.endswith("_extra_state")]
                if missing or unexpected:
                    raise RuntimeError(f"the reference model does not match the policy: missing {missing[:3]}, "
                                       f"unexpected {unexpected[:3]}")
        for module in modules:
            module.requires_grad_(False)
            module.eval()
        from adaptor.log import notice

        source = "loaded from --ref-model" if self._load is not None else "copied from the policy's starting weights"
        notice(f"DPO reference: a second model in memory, {sum(p.numel() for m in modules for p in m.parameters())} "
               f"parameters on rank 0, {source} (--precompute-ref-logps / --ref-logps avoid the copy)")
        return modules


def is_hf_directory(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def checkpoint_loader(path: str, iteration: Optional[int] = None) -> Callable[[torch.nn.Module], None]:
    """``load(modules)`` for ``--ref-model path`` (the reference's model chunks): a Hugging Face directory (config.json and safetensors,
    converted on the fly as ``--hf-load-dir`` is) or a Megatron checkpoint (``load_checkpoint``, weights
    only, ``iteration`` or its latest). The run's arguments are restored afterwards, so nothing of the
    policy's own loading (iteration, consumed samples) changes."""

    def load(modules: list) -> None:
        from megatron.training import get_args

        args = get_args()
        saved = dict(vars(args))
        try:
            if is_hf_directory(path):
                _load_hf(modules, path, args)
            else:
                from megatron.training.checkpointing import load_checkpoint

                args.load, args.finetune, args.no_load_optim, args.no_load_rng = path, True, True, True
                args.ckpt_step = iteration
                load_checkpoint(modules, None, None, strict=True)
        finally:
            vars(args).clear()
            vars(args).update(saved)

    return load


def _load_hf(modules: list, path: str, args) -> None:
    from adaptor.convert.config_check import hf_model_type, read_hf_config
    from adaptor.convert.online import load_hf_weights

    args.model_type_hf = hf_model_type(read_hf_config(path, "--ref-model"), args.model_type_hf, "--ref-model")
    args.hf_load_dir = path
    load_hf_weights(modules, args)
