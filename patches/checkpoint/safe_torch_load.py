"""Checkpoints are unpickled with ``weights_only=True`` and an explicit allow-list, and a refused or
unreadable file is one line.

A ``--ckpt-format torch`` checkpoint (and ``common.pt``, and the distributed optimizer's state file)
is a pickle that can run any code. Upstream code changed:

* ``torch.load``, for the whole run: ``weights_only=True`` with :data:`adaptor.safe_load.ALLOWED`,
  whatever the caller or ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` asks (Megatron's loads pass nothing);
  another global ends the run with one line naming the file and the global.
* ``megatron.training.checkpointing._load_base_checkpoint`` ends an unreadable ``torch`` file with a
  reason-less ``sys.exit()`` (status 0); it is now one ``megatron-adaptor: error:`` line, status 2.

``--ckpt-allow-unsafe-pickle`` turns the restriction off for trusted checkpoints, said at start.

Remove when: Megatron's ``_load_base_checkpoint`` ends an unreadable ``--ckpt-format torch`` file
with a non-zero status and the reason; then that wrapper and the error path it turns on go. Not
fixed upstream as of megatron-core 0.19.2 (checkpointing.py lines 1738-1743, a bare ``sys.exit()``)
nor on Megatron-LM main (d98e8a64, 2026-08-22); no upstream issue or PR found. The ``torch.load``
restriction is this adaptor's policy rather than a workaround of an upstream defect (Megatron's
loads follow torch's default and its environment variable), so it stays.
"""
from __future__ import annotations

import contextvars

from adaptor.features import Feature

OWNER = __name__
_in_checkpoint_load = contextvars.ContextVar("in_megatron_checkpoint_load", default=False)


def _fail_on(f, exc: BaseException) -> "NoReturn":  # noqa: F821
    from adaptor.errors import fail
    from adaptor.safe_load import describe

    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    fail(f"{describe(f)}: cannot read the checkpoint ({type(exc).__name__}: {first})")


def _safe_torch_load(wrapped, instance, call_args, kwargs):
    from adaptor.errors import fail
    from adaptor.safe_load import RefusedPickle, load

    f = call_args[0] if call_args else kwargs.get("f")
    try:
        return load(wrapped, *call_args, **kwargs)
    except RefusedPickle as exc:
        fail(f"{exc}; if you trust this file, --ckpt-allow-unsafe-pickle loads it anyway")
    except Exception as exc:  # noqa: BLE001  (only inside Megatron's checkpoint load, below)
        if _in_checkpoint_load.get():
            _fail_on(f, exc)
        raise


def _unsafe_torch_load(wrapped, instance, call_args, kwargs):
    if kwargs.get("weights_only") is not True:
        kwargs["weights_only"] = False
    f = call_args[0] if call_args else kwargs.get("f")
    try:
        return wrapped(*call_args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        if _in_checkpoint_load.get():
            _fail_on(f, exc)
        raise


def _load_base_checkpoint(wrapped, instance, call_args, kwargs):
    token = _in_checkpoint_load.set(True)
    try:
        return wrapped(*call_args, **kwargs)
    finally:
        _in_checkpoint_load.reset(token)


class SafeTorchLoad(Feature):
    name = "safe_torch_load"

    def add_arguments(self, group) -> None:
        group.add_argument("--ckpt-allow-unsafe-pickle", action="store_true", dest="ckpt_allow_unsafe_pickle",
                           help="Unpickle torch-format checkpoint files without restriction (weights_only=False). "
                                "RISK: a checkpoint file can then run arbitrary code in this process; use only "
                                "for files you trust. Without it, a file naming anything beyond tensors and the "
                                "types Megatron saves is refused.")

    def register_patches(self, pm, ctx) -> None:
        unsafe = bool(getattr(ctx.flags, "ckpt_allow_unsafe_pickle", False))
        pm.register_wrapper("torch.load", _unsafe_torch_load if unsafe else _safe_torch_load, OWNER)
        pm.register_wrapper("megatron.training.checkpointing._load_base_checkpoint", _load_base_checkpoint, OWNER)

    def validate(self, args, ctx) -> None:
        if getattr(args, "ckpt_allow_unsafe_pickle", False):
            from adaptor.log import notice_once

            notice_once("warning: --ckpt-allow-unsafe-pickle: checkpoint files are unpickled without restriction; "
                        "a malicious file can run arbitrary code in this process", key="ckpt_allow_unsafe_pickle")
