"""Stop with one line when a dataset split that must yield samples has no tokens.

Upstream: ``megatron.core.datasets.gpt_dataset.GPTDataset._get_num_epochs`` adds epochs until they
cover the requested samples; for a split with no tokens (a small ``--split`` share, or all-empty
documents) the loop never ends and training hangs silently, even for ``--eval-iters 0`` (the request
counts one extra token). An empty split asked for nothing gets one empty epoch; one that must yield
samples stops with one line naming the dataset, the split and what to change.

Remove when: ``_get_num_epochs`` (or the dataset builder before it) stops with a message on a split
that has no tokens but must yield samples, and still accepts one asked for none. Not fixed as of
megatron-core 0.19.2 nor on Megatron-LM main (d98e8a64, 2026-08-22). Reported in
https://github.com/NVIDIA/Megatron-LM/issues/957 (open); the open PR
https://github.com/NVIDIA/Megatron-LM/pull/5519 raises on every zero-token split, including one
asked for no samples, so that case would still need this wrapper.
"""
from __future__ import annotations

from adaptor.errors import fail
from adaptor.features import Feature
from adaptor.wrapping import argument

OWNER = __name__


def _get_num_epochs(wrapped, instance, call_args, kwargs):
    num_tokens_per_epoch = argument(call_args, kwargs, "num_tokens_per_epoch")
    if num_tokens_per_epoch > 0:
        return wrapped(*call_args, **kwargs)
    if not instance.num_samples:
        return 1
    split = instance.index_split.name
    fail(
        f"dataset {instance.dataset_path}: the {split} split has {len(instance.indices)} documents and no "
        f"tokens, but {instance.num_samples} {split} samples are needed; give it a larger share in "
        f"--split (now {instance.config.split}), add data, or ask for no {split} samples "
        f"(--eval-iters 0 for validation, a zero share for test)"
    )


class EmptyDatasetSplit(Feature):
    name = "empty_dataset_split"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.core.datasets.gpt_dataset.GPTDataset._get_num_epochs", _get_num_epochs, OWNER)
