"""The checkpoint a run resumes from, checked before the model is built; Megatron's quiet exits made loud.

Upstream: ``megatron.training.checkpointing`` reads ``--load`` only after the model exists, and several
refusals (bad tracker file, unreadable torch file, unknown version, missing RNG state,
``--exit-on-missing-checkpoint``) are ``sys.exit()``, status 0, so schedulers see success. Here
:func:`adaptor.preflight.checkpoint_dirs.check_load_dir` checks ``--load`` and
``--pretrained-checkpoint`` at validation on every rank, and ``training.checkpointing.load_checkpoint``,
``load_args_from_checkpoint`` and ``read_metadata`` are wrapped: a status 0/None ``SystemExit`` becomes
one error line and status 1, an ``AssertionError`` one line with Megatron's message, and so do the
``RuntimeError``s that refuse a distributed-optimizer checkpoint at another layout.
"""
from __future__ import annotations

from adaptor.errors import fail
from adaptor.features import Feature
from adaptor.preflight.checkpoint_dirs import check_load_inputs

OWNER = __name__
WRAPPED = ("load_checkpoint", "load_args_from_checkpoint", "read_metadata")
# RuntimeErrors load_checkpoint raises when the checkpoint's optimizer layout cannot be read at this
# run's layout; each message says which flag to save with instead.
LAYOUT_REFUSALS = ("(TP, PP) mismatch after resume", "Loading optimizer state from a GPT checkpoint into a hybrid")


def _exit_status_kept(wrapped, instance, call_args, kwargs):
    try:
        return wrapped(*call_args, **kwargs)
    except AssertionError as exc:
        # Megatron's consistency asserts between the run and the checkpoint (the learning-rate
        # schedule, say): the message says what differs.
        fail(f"the checkpoint does not fit this run: {' '.join(str(exc).split()) or 'an assertion failed'}", code=1)
    except RuntimeError as exc:
        if not str(exc).startswith(LAYOUT_REFUSALS):
            raise
        fail(f"the checkpoint does not fit this run: {' '.join(str(exc).split())}", code=1)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
        fail(f"Megatron stopped in {wrapped.__name__} (megatron.training.checkpointing) with its reason printed "
             f"above and a success status; exiting with status 1 instead", code=1)


class CheckpointInputs(Feature):
    name = "checkpoint_inputs"

    def register_patches(self, pm, ctx) -> None:
        for function in WRAPPED:
            pm.register_wrapper(f"megatron.training.checkpointing.{function}", _exit_status_kept, OWNER)

    def validate(self, args, ctx) -> None:
        check_load_inputs(args)
