"""Skip validation when the data give no validation set, as ``--eval-iters`` with a zero ``--split`` share asks.

Upstream: ``megatron.training.training.build_train_valid_test_data_loaders`` keeps its validation
loaders in a list (one per validation set) and sets ``do_valid`` when that list ``is not None``;
it always is, so a run whose validation share is empty (``--split 100,0,0``) with ``--eval-iters``
above 0 calls ``evaluate`` on a ``None`` iterator and dies with "'NoneType' object is not an
iterator" at its first evaluation, after training. Fine-tuning scripts pass exactly that
(MindSpeed-LLM's Llama 3.1 tune script: ``--split 100,0,0 --eval-iters 10``). ``do_valid`` now
also needs one built validation loader on some rank; every rank agrees through one all-reduce.

Remove when: ``do_valid`` looks at the loaders in the list rather than at the list. Not fixed in
megatron-core 0.19.2 (training.py, ``build_train_valid_test_data_loaders``).
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__


def _build_loaders(wrapped, instance, call_args, kwargs):
    train, valid, test = wrapped(*call_args, **kwargs)
    from megatron.training import get_args

    args = get_args()
    if not args.do_valid:
        return train, valid, test
    import torch

    # only tensor-parallel rank 0 builds loaders; the others hold None and contribute 0
    built = torch.tensor([int(valid is not None and any(loader is not None for loader in valid))],
                         dtype=torch.long, device="cuda")
    torch.distributed.all_reduce(built, op=torch.distributed.ReduceOp.MAX)
    if not built.item():
        args.do_valid = False
    return train, valid, test


class NoValidationSplit(Feature):
    name = "no_validation_split"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.build_train_valid_test_data_loaders", _build_loaders, OWNER)
