"""A save that fails (no space, file too large, I/O error) keeps the last checkpoint and never goes unnoticed.

Upstream: an ``OSError`` inside ``megatron.training.checkpointing.save_checkpoint`` kills one rank
with a traceback while the others wait until the process group times out. Here:

* ``--ckpt-format safetensors``: all ranks agree on the outcome (:mod:`adaptor.checkpoint.serialization`);
  on failure nothing is committed and the tracker keeps the previous checkpoint. The agreed
  ``SaveFailed`` reaches ``save_checkpoint`` or ``megatron.training.async_utils.maybe_finalize_async_save``,
  both wrapped;
* ``--save-failure-retries N`` (default 0): up to N failures in a row are one line each and training
  goes on; one more, or a failed last save, exits with status 1 and one line;
* ``torch`` / ``torch_dist``: an ``OSError`` is one line and status 1 (Megatron updates the tracker
  only after a complete save).
"""
from __future__ import annotations

import re
from pathlib import Path

from adaptor.checkpoint.files import TRACKER, tracked_dir_name
from adaptor.errors import fail
from adaptor.features import ArgumentError, Feature
from adaptor.log import notice

OWNER = __name__
_in_a_row = 0
_failed_at: int | None = None


def _iteration(checkpoint_dir: str) -> int | None:
    match = re.search(r"iter_(\d+)$", str(checkpoint_dir).rstrip("/"))
    return int(match.group(1)) if match else None


def _tracked(save: str) -> str | None:
    try:
        return (Path(save) / TRACKER).read_text().strip()
    except OSError:
        return None


def _kept(save: str) -> str:
    tracked = _tracked(save)
    if tracked is None:
        return "no earlier checkpoint exists"
    name = tracked_dir_name(tracked) or tracked
    return f"the previous checkpoint {Path(save) / name} is intact and is what a resume loads"


def _note_success(args) -> None:
    global _in_a_row, _failed_at
    tracked = _tracked(args.save) if args.save else None
    if _failed_at is not None and tracked and tracked.isdigit() and int(tracked) > _failed_at:
        _in_a_row, _failed_at = 0, None


def _decide(exc, args) -> None:
    """Exit, or say one line and let training go on; see the module docstring."""
    global _in_a_row, _failed_at
    _in_a_row += 1
    iteration = _iteration(exc.checkpoint_dir)
    _failed_at = iteration if iteration is not None else _failed_at
    budget = args.save_failure_retries
    base = f"checkpoint save failed ({exc.reason}); {_kept(args.save)}"
    last = iteration is not None and args.train_iters is not None and iteration >= args.train_iters
    if last or _in_a_row > budget:
        why = ("it was the run's last save" if last else
               f"{_in_a_row} failed saves in a row, --save-failure-retries {budget}" if budget else
               "--save-failure-retries 0; pass N > 0 to train on through N failed saves")
        fail(f"{base}; exiting ({why})", code=1)
    notice(f"warning: {base}; training goes on and saves again at the next --save-interval "
           f"({_in_a_row} of {budget} failed saves in a row allowed)")


def _save_checkpoint(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    from adaptor.checkpoint.serialization import SaveFailed

    args = get_args()
    try:
        result = wrapped(*call_args, **kwargs)
    except SaveFailed as exc:
        _decide(exc, args)
        return None
    except OSError as exc:
        if args.ckpt_format == "safetensors":
            raise
        fail(f"checkpoint save to {args.save} failed ({exc.filename or args.save}: {exc.strerror or exc}); "
             f"{_kept(args.save)}; exiting", code=1)
    _note_success(args)
    return result


def _maybe_finalize_async_save(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    from adaptor.checkpoint.serialization import SaveFailed

    try:
        result = wrapped(*call_args, **kwargs)
    except SaveFailed as exc:
        _decide(exc, get_args())
        return None
    _note_success(get_args())
    return result


class SaveFailures(Feature):
    name = "save_failures"

    def add_arguments(self, group) -> None:
        group.add_argument("--save-failure-retries", type=int, default=0, dest="save_failure_retries", metavar="N",
                           help="failed checkpoint saves in a row to train on through (each reported, the previous "
                                "checkpoint kept, saved again at the next --save-interval); default 0: the first "
                                "failure exits with status 1. Needs --ckpt-format safetensors")

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.checkpointing.save_checkpoint", _save_checkpoint, OWNER)
        pm.register_wrapper("megatron.training.async_utils.maybe_finalize_async_save", _maybe_finalize_async_save,
                            OWNER)

    def validate(self, args, ctx) -> None:
        if args.save_failure_retries < 0:
            raise ArgumentError(f"--save-failure-retries {args.save_failure_retries}: must be 0 or more")
        if args.save_failure_retries and args.ckpt_format != "safetensors":
            raise ArgumentError(f"--save-failure-retries {args.save_failure_retries} needs --ckpt-format safetensors "
                                f"(now {args.ckpt_format}): only it agrees across ranks that a save failed before "
                                f"anything is committed")
