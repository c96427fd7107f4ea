"""Directories a run writes into, checked before the first step; and room for one checkpoint.

Upstream creates ``--save``'s directory only at the first save
(``megatron.training.checkpointing.save_checkpoint``), so a bad ``--save`` or a full disk surfaces
after a whole save interval. No upstream function is changed: at validation ``--save``,
``--data-cache-path``, ``--tensorboard-dir``, ``--wandb-save-dir`` and ``--hf-save-dir`` must be
writable directories (:func:`adaptor.preflight.output_dirs.check_writable_dir`); once the padded
vocabulary is known (``megatron.training.global_vars.set_global_variables``, wrapped), ``--save``'s
filesystem must have room for one checkpoint (:mod:`adaptor.preflight.checkpoint_size`), since a new
one completes before the old is pruned. ``--skip-save-space-check`` skips that. Where megatron-core's
estimator cannot count these arguments, one line on rank 0 says the check did not run, and why.
"""
from __future__ import annotations

from adaptor.errors import fail
from adaptor.features import ArgumentError, Feature
from adaptor.log import notice
from adaptor.preflight.checkpoint_size import EstimateFailed, checkpoint_bytes
from adaptor.preflight.output_dirs import check_free_space, check_output_dirs
from adaptor.wrapping import argument

OWNER = __name__

def check_save_space(args) -> None:
    if not getattr(args, "save", None) or getattr(args, "skip_save_space_check", False):
        return
    try:
        need = checkpoint_bytes(args)
    except EstimateFailed as exc:
        notice(f"warning: the free-space check of --save did not run: megatron-core's parameter estimator "
               f"failed on these arguments ({exc})")
        return
    check_free_space(args.save, "--save", need, "one checkpoint of this model", "--skip-save-space-check")


def _set_global_variables(wrapped, instance, call_args, kwargs):
    result = wrapped(*call_args, **kwargs)
    try:
        check_save_space(argument(call_args, kwargs, "args"))
    except ArgumentError as exc:
        fail(str(exc))
    return result


class OutputDirs(Feature):
    name = "output_dirs"

    def add_arguments(self, group) -> None:
        group.add_argument("--skip-save-space-check", action="store_true", dest="skip_save_space_check",
                           help="do not check at start that --save's filesystem has room for one checkpoint")

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.global_vars.set_global_variables", _set_global_variables, OWNER)

    def validate(self, args, ctx) -> None:
        check_output_dirs(args)
