"""``python pretrain_gpt.py ...`` without torchrun runs as ``torchrun --nproc_per_node 1`` would.

No upstream function is changed. Megatron's ``initialize_megatron`` calls
``torch.distributed.init_process_group`` with the ``env://`` rendezvous, which needs the variables
torchrun exports (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``);
started by plain ``python`` it stopped with a ``MASTER_ADDR expected`` traceback. When none of
those variables is set, this feature sets them for one process on the loopback address with a
free port, once Megatron has parsed the command line (so a tool that only imports ``adaptor``
changes no environment), and says so. A partial set (``WORLD_SIZE`` without ``MASTER_ADDR``, say)
is a launcher's mistake, not a single process: one line, exit 2.
"""
from __future__ import annotations

import os
import socket

from adaptor.features import ArgumentError, Feature
from adaptor.log import say

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_process_environment(environ=None) -> dict[str, str]:
    """The variables to set for a one-process run; empty when a launcher already set them all."""
    environ = os.environ if environ is None else environ
    present = [name for name in LAUNCH_VARS if environ.get(name)]
    if len(present) == len(LAUNCH_VARS):
        return {}
    if present:
        missing = [name for name in LAUNCH_VARS if name not in present]
        raise ArgumentError(f"the launcher set {', '.join(present)} but not {', '.join(missing)}; start "
                            f"with torchrun, or unset them all to run as a single process")
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}


class SingleProcessLaunch(Feature):
    name = "single_process_launch"

    def set_defaults(self, args, ctx) -> None:
        try:
            env = single_process_environment()
        except ArgumentError:
            return  # validate() reports it
        if not env:
            return
        os.environ.update(env)
        args.rank, args.world_size = 0, 1
        say(f"no torchrun environment: one process on {env['MASTER_ADDR']}:{env['MASTER_PORT']}")

    def validate(self, args, ctx) -> None:
        single_process_environment()  # a partial launcher environment is one line
