"""Keep the training data loader away from the generator Megatron checkpoints, so a resume is bit-exact.

Upstream: ``megatron.training.datasets.data_samplers.build_pretraining_data_loader`` builds a
``torch.utils.data.DataLoader`` without a ``generator``. Each ``iter()`` of such a loader draws
its workers' base seed from torch's default CPU generator (``_BaseDataLoaderIter.__init__``:
``torch.empty((), dtype=torch.int64).random_(generator=None)``). Megatron makes that ``iter()``
in ``build_train_valid_test_data_iterators``, after ``setup_model_and_optimizer`` has restored the
checkpoint's RNG states (``load_checkpoint``: ``random``, NumPy, ``torch_rng_state``,
``cuda_rng_state``, then the model-parallel tracker's states), and again at each epoch with
``--dataloader-type cyclic``. An uninterrupted run draws once, before iteration 1; a resumed run
draws once more, after the restore. From there on the resumed run's CPU generator is one draw
ahead of the uninterrupted run's, and so is every RNG state it saves.

On CUDA and NPU only the saved ``torch_rng_state`` shows it. On the CPU backend Megatron's device
generator *is* torch's CPU generator (``torch.cuda.get/set_rng_state`` and the RNG tracker's
``_get/_set_cuda_rng_state`` are redirected to it by the ``cpu_device`` feature, as
``npu_device`` redirects them to the NPU's), so every dropout mask drawn outside a tracker fork
(the hidden dropout after attention and MLP; attention dropout runs in the tracker's fork, whose
state was restored right) differs after a resume, and the losses leave the uninterrupted curve.

The fix gives each pretraining data loader a generator of its own, seeded from ``--seed``, so the
data pipeline no longer consumes the generator that training and checkpoints share. The loader
draws the same sequence of base seeds in every run, and a resumed run continues every RNG stream
exactly where the checkpoint left it, with dropout on, on every backend.

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
