"""Early, one-line errors for parallel layouts Megatron would reject deep inside.

Upstream: ``megatron.training.arguments.validate_args`` asserts on parallel
layouts, and ``megatron.core.parallel_state.initialize_model_parallel`` on the expert layout and on
``--num-distributed-optimizer-instances`` (which must divide the data-parallel x context-parallel
size and the expert data-parallel size). These checks run before Megatron's validation (through
``adaptor.arguments_hook``) and name the flags involved (the world-size message
spells out the three parallel-size flags, not just their values, so the user
knows what to change). The checks live in ``adaptor/preflight/parallel_layout.py``
because the command line is checked with them before torch is imported too.
Files the run reads and writes are checked by the features in ``patches/preflight/``.
"""
from __future__ import annotations

from adaptor.features import Feature
from adaptor.preflight.parallel_layout import check_parallel_layout


class ArgumentChecks(Feature):
    name = "argument_checks"

    def validate(self, args, ctx) -> None:
        check_parallel_layout(args)
