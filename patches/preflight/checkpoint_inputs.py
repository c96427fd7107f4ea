"""The checkpoint a run resumes from, checked before the model is built; Megatron's quiet exits made loud.

Upstream: ``megatron.training.checkpointing`` reads ``--load`` after the model and optimizer
exist, and several of its refusals are ``print_rank_0(...); sys.exit()``: garbage in
``latest_checkpointed_iteration.txt`` ("Invalid metadata file ... Exiting"), a torch-format
file it cannot unpickle ("could not load the checkpoint"), an unknown checkpoint version,
missing RNG state, ``--exit-on-missing-checkpoint``. ``sys.exit()`` is status 0, so a
scheduler records the failed job as a success.

* validation: :func:`adaptor.preflight.checkpoint_dirs.check_load_dir` checks ``--load`` and
  ``--pretrained-checkpoint`` on every rank (tracker, iteration directory, each format's files);
* ``training.checkpointing.load_checkpoint``, ``load_args_from_checkpoint`` and
  ``read_metadata`` are wrapped: a ``SystemExit`` with status 0 or None leaving them becomes
  one error line and status 1 (Megatron's own reason is printed just above it), and an
  ``AssertionError`` (a checkpoint whose learning-rate schedule differs from the run's, say)
  becomes one line with Megatron's message instead of a traceback.
"""
from __future__ import annotations

from adaptor.errors import fail
from adaptor.features import Feature
from adaptor.preflight.checkpoint_dirs import check_load_inputs

OWNER = __name__
WRAPPED = ("load_checkpoint", "load_args_from_checkpoint", "read_metadata")


def _exit_status_kept(wrapped, instance, call_args, kwargs):
    try:
        return wrapped(*call_args, **kwargs)
    except AssertionError as exc:
        # Megatron's consistency asserts between the run and the checkpoint (the learning-rate
        # schedule, say): the message says what differs.
        fail(f"the checkpoint does not fit this run: {' '.join(str(exc).split()) or 'an assertion failed'}", code=1)
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
