"""Keep the training data loader away from the generator Megatron checkpoints, so a resume is bit-exact.

Upstream: ``megatron.training.datasets.data_samplers.build_pretraining_data_loader`` builds a
``torch.utils.data.DataLoader`` without a ``generator``, so each ``iter()`` draws a base seed from
torch's default CPU generator. A resumed run makes that ``iter()`` after ``load_checkpoint`` restored
the RNG states, so its CPU generator (and every RNG state it saves) is one draw ahead of an
uninterrupted run's. On the CPU backend that generator is also the device generator (``cpu_device``),
so dropout masks outside the tracker fork differ and the losses leave the curve. Each pretraining
loader now gets a generator of its own seeded from ``--seed``.

Remove when: ``build_pretraining_data_loader`` passes a generator of its own to the DataLoader (or
Megatron restores the checkpoint's RNG states after the data iterators are built). Not fixed
upstream as of megatron-core 0.19.2 (data_samplers.py line 105) nor on Megatron-LM main (d98e8a64,
2026-08-22); no Megatron-LM issue found. The same defect in Megatron-Bridge's copy of the function:
https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/5257.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__


def _build_pretraining_data_loader(wrapped, instance, call_args, kwargs):
    import torch
    from megatron.training import get_args

    loader = wrapped(*call_args, **kwargs)
    if isinstance(loader, torch.utils.data.DataLoader) and loader.generator is None:
        loader.generator = torch.Generator().manual_seed(get_args().seed)
    return loader


class ResumeRngState(Feature):
    name = "resume_rng_state"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.datasets.data_samplers.build_pretraining_data_loader",
                            _build_pretraining_data_loader, OWNER)
