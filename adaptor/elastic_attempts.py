"""Each attempt torchrun starts forms its process groups under keys of its own, within a deadline.

torchrun's c10d rendezvous starts one TCPStore server for the workers at the first rendezvous and
hands the same ``MASTER_ADDR:MASTER_PORT`` to every later attempt (``TORCHELASTIC_USE_AGENT_STORE``);
the static rendezvous does the same with its own store. torch's ``env://`` handler connects to it
without a per-attempt prefix, so a restarted attempt finds the killed attempt's keys: gloo reads the
dead ranks' listening addresses under the same group names ("Connection refused" in
``connectFullMesh``), or waits on keys nobody will write again. The restart count cannot serve as a
prefix: on another node, an agent that restarts because a peer re-joined keeps its count.

Here the attempt's ranks agree on a fresh key space through the store itself. Rank 0 draws a random
token; every other rank posts a random nonce of its own and waits for rank 0's answer under a key
named by that nonce (so no earlier attempt can have written it), then confirms under a key named by
the token. Rank 0 keeps answering the latest nonce of each rank until all have confirmed, so a nonce
a dead earlier rank left behind costs nothing. Every key the process groups use is then prefixed by
the token. The handshake is bounded by the process-group timeout (``--distributed-timeout-minutes``),
and ends in one line saying how long it waited and which ranks never arrived.
"""
from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

_ROOT = "adaptor/attempt"


class RendezvousStall(RuntimeError):
    """Not every rank of this attempt arrived within the timeout."""


def uses_agent_store(environ=None) -> bool:
    """Started by torchrun's agent, whose store outlives each attempt's workers."""
    environ = os.environ if environ is None else environ
    return environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and bool(environ.get("MASTER_PORT"))


def _ranks(ranks: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9`` (a node's ranks are contiguous)."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


def agree_on_attempt(store, rank: int, world_size: int, timeout: timedelta, poll_s: float = 0.05) -> str:
    """The token all ``world_size`` ranks of this attempt share; RendezvousStall past ``timeout``."""
    started = time.monotonic()
    deadline = started + timeout.total_seconds()
    if world_size == 1:
        return uuid.uuid4().hex
    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(f"{_ROOT}/join/{rank}", nonce)
        answer = f"{_ROOT}/answer/{nonce}"
        while not store.check([answer]):
            if time.monotonic() > deadline:
                raise RendezvousStall(f"rank {rank} waited {time.monotonic() - started:.0f} s for rank 0 to "
                                      f"form this attempt's process groups; rank 0 never arrived")
            time.sleep(poll_s)
        token = store.get(answer).decode()
        store.set(f"{_ROOT}/{token}/confirmed/{rank}", "1")
        return token
    token = uuid.uuid4().hex
    answered: dict[int, bytes] = {}
    pending = list(range(1, world_size))
    while pending:
        for r in pending:
            join = f"{_ROOT}/join/{r}"
            if store.check([join]):
                nonce = store.get(join)
                if answered.get(r) != nonce:
                    store.set(f"{_ROOT}/answer/{nonce.decode()}", token)
                    answered[r] = nonce
        pending = [r for r in pending if not store.check([f"{_ROOT}/{token}/confirmed/{r}"])]
        if not pending:
            break
        if time.monotonic() > deadline:
            raise RendezvousStall(f"rank 0 waited {time.monotonic() - started:.0f} s for all {world_size} ranks "
                                  f"to form this attempt's process groups; rank(s) {_ranks(pending)} never "
                                  f"arrived (their own output, or their node's, says why)")
        time.sleep(poll_s)
    return token


def attempt_store(rank: int, world_size: int, timeout: timedelta):
    """A client of the agent's store whose keys belong to this attempt alone."""
    import torch.distributed as dist

    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                           is_master=False, timeout=timeout)
    token = agree_on_attempt(client, rank, world_size, timeout)
    return dist.PrefixStore(f"{_ROOT}/{token}", client)


def launcher_rendezvous(pid: int | None = None) -> tuple[str, int] | None:
    """(rendezvous backend, most nodes) of the torchrun that started this process, read from its command
    line as torchrun itself parses it; None when the parent is not torchrun (another launcher, a test)."""
    pid = os.getppid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    return torchrun_rendezvous(argv)


def torchrun_rendezvous(argv: list[str]) -> tuple[str, int] | None:
    """(rendezvous backend, most nodes) of a torchrun command line; None when ``argv`` is not torchrun's."""
    if argv and os.path.basename(argv[0]) == "torchrun":
        rest = argv[1:]
    elif "-m" in argv and argv.index("-m") + 1 < len(argv) and argv[argv.index("-m") + 1] == "torch.distributed.run":
        rest = argv[argv.index("-m") + 2:]
    else:
        return None
    from torch.distributed.run import get_args_parser

    try:
        opts, _ = get_args_parser().parse_known_args(rest)
    except SystemExit:
        return None
    backend = "c10d" if opts.standalone else opts.rdzv_backend
    try:
        nodes = int(str(opts.nnodes).split(":")[-1])
    except ValueError:
        return None
    return backend, nodes


def restart_refusal(environ=None, launcher=None) -> str | None:
    """Why the restarts this launch asks for cannot happen, or None: under torch's static rendezvous an
    agent restarts its own node's workers only, so over several nodes a restarted node never re-forms
    the group with the others, which wait in their collectives until the timeout."""
    environ = os.environ if environ is None else environ
    try:
        restarts = int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    except ValueError:
        return None
    if restarts <= 0:
        return None
    launcher = launcher_rendezvous() if launcher is None else launcher
    if launcher is None:
        return None
    backend, nodes = launcher
    if backend == "static" and nodes > 1:
        return (f"--max-restarts {restarts} over {nodes} nodes with torchrun's static rendezvous: a restarted "
                f"node's workers cannot rejoin the other nodes' (their agents do not restart them); launch with "
                f"--rdzv-backend c10d --rdzv-endpoint HOST:PORT, or --max-restarts 0")
    return None
