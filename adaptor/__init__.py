"""megatron-adaptor: run megatron-core 0.19.2's own training loop on NPU, GPU and CPU.

The statement ``import adaptor``, first in a training script, sets the run up (before or after
megatron was imported): it checks the megatron-core version, answers command-line errors it can
find without torch, then :func:`adaptor.bootstrap.setup` picks the backend, asks every feature
whether it applies and applies their patches, printing them on rank 0.

Importing a module of the package (``from adaptor.checkpoint import reader``, ``import
adaptor.ops.rmsnorm``) uses it as a library: nothing is set up or patched, and torch is imported
only by the modules that need it. So tools and tests import what they use, and a training script
must write ``import adaptor`` before any other ``adaptor`` import (the entry files do it first).
The run's state lives in :mod:`adaptor.run_state`; :func:`adaptor.bootstrap.teardown` undoes setup.
"""
from __future__ import annotations

import sys

__version__ = "0.1.0"


def _is_the_bootstrap_statement() -> bool:
    """Whether the import running this file is ``import adaptor`` itself, not a submodule or a
    ``from adaptor import ...``: the caller's instruction names it (CPython has no public hook)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    if frame is None:
        return True
    import dis

    previous = None
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset == frame.f_lasti:
            if instruction.opname != "IMPORT_NAME":
                return frame.f_locals.get("name", "adaptor") == "adaptor"  # importlib.import_module
            fromlist = previous.argval if previous is not None and previous.opname == "LOAD_CONST" else None
            return instruction.argval == "adaptor" and not fromlist
        previous = instruction
    return True


if _is_the_bootstrap_statement():
    from adaptor.version import check_megatron_version

    check_megatron_version()
    from adaptor.command_line.early_check import check_entry_command_line

    check_entry_command_line()  # before torch is imported
    from adaptor.bootstrap import setup

    setup()
