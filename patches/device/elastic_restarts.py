"""A worker torchrun restarts re-forms its process groups; restarts that cannot happen are refused at start.

Changes ``torch.distributed.init_process_group``: when torchrun's agent hosts the store
(``TORCHELASTIC_USE_AGENT_STORE``) and the caller passes neither a store nor an init method (Megatron's
``_initialize_distributed`` passes ``store=None``), the group is formed on a store whose keys belong to
this attempt alone, after all ranks of the attempt have arrived (``adaptor.elastic_attempts``). Without
it, torch's ``env://`` handler reuses the agent's store unprefixed, and a restarted attempt reads the
killed attempt's gloo addresses and fails, or waits on keys nobody writes, past the timeout. It can go
when torch's ``env://`` rendezvous prefixes the agent's store per attempt again.

At start, ``--max-restarts`` above 0 under torchrun's static rendezvous over several nodes is one line
(status 2): there, the agents of the nodes whose workers did not fail never restart them.
"""
from __future__ import annotations

import os
from datetime import timedelta

from adaptor import elastic_attempts
from adaptor.errors import fail
from adaptor.features import ArgumentError, Feature

OWNER = __name__


def _init_process_group(wrapped, instance, call_args, kwargs):
    if (call_args or kwargs.get("store") is not None or kwargs.get("init_method") is not None
            or not elastic_attempts.uses_agent_store()):
        return wrapped(*call_args, **kwargs)
    rank = kwargs.get("rank", -1)
    rank = int(os.environ["RANK"]) if rank is None or rank < 0 else rank
    world_size = kwargs.get("world_size", -1)
    world_size = int(os.environ["WORLD_SIZE"]) if world_size is None or world_size < 0 else world_size
    timeout = kwargs.get("timeout") or timedelta(minutes=10)
    try:
        kwargs["store"] = elastic_attempts.attempt_store(rank, world_size, timeout)
    except elastic_attempts.RendezvousStall as exc:
        fail(str(exc) + "; raise --distributed-timeout-minutes if ranks legitimately start later", code=1)
    kwargs["rank"], kwargs["world_size"] = rank, world_size
    return wrapped(*call_args, **kwargs)


class ElasticRestarts(Feature):
    name = "elastic_restarts"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("torch.distributed.init_process_group", _init_process_group, OWNER)

    def validate(self, args, ctx) -> None:
        refusal = elastic_attempts.restart_refusal()
        if refusal:
            raise ArgumentError(refusal)
