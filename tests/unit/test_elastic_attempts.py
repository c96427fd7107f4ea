"""A restarted attempt's ranks agree on fresh store keys despite what a killed attempt left; stalls are bounded
and name the missing ranks; restarts torch's static rendezvous cannot give are refused.

The ranks are threads, each with its own client of one real TCPStore, as torchrun's workers are of the
agent's store. The killed-restart itself, through torchrun, is in tests/e2e/test_chaos_resume.py.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from adaptor.elastic_attempts import RendezvousStall, agree_on_attempt, restart_refusal, torchrun_rendezvous


@pytest.fixture
def server():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    yield store


def _client(server):
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))


def _attempt(server, world: int, delays: dict[int, float] | None = None, ranks=None, timeout_s: float = 20):
    """Run ``ranks`` (default all) of one attempt as threads; {rank: token or exception}."""
    results: dict[int, object] = {}

    def rank_main(rank):
        time.sleep((delays or {}).get(rank, 0))
        try:
            results[rank] = agree_on_attempt(_client(server), rank, world, timedelta(seconds=timeout_s), poll_s=0.01)
        except RendezvousStall as exc:
            results[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (range(world) if ranks is None else ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_every_rank_of_an_attempt_gets_one_token_and_a_later_attempt_another(server):
    first = _attempt(server, 4)
    assert len(set(first.values())) == 1 and all(isinstance(v, str) for v in first.values()), first
    # The next attempt's rank 0 starts first and finds the dead attempt's join keys and answers in place:
    # the late ranks must still get the new attempt's token, not the old one.
    second = _attempt(server, 4, delays={1: 0.3, 2: 0.5, 3: 0.7})
    assert len(set(second.values())) == 1 and all(isinstance(v, str) for v in second.values()), second
    assert set(second.values()) != set(first.values())


def test_a_rank_that_never_arrives_ends_the_attempt_naming_it_and_the_wait(server):
    start = time.monotonic()
    got = _attempt(server, 4, ranks=[0, 1], timeout_s=1.0)
    assert time.monotonic() - start < 10
    assert isinstance(got[0], RendezvousStall), got
    assert "rank 0 waited 1 s" in str(got[0]) and "rank(s) 2-3 never arrived" in str(got[0]), got[0]
    assert isinstance(got[1], str), got  # it arrived: rank 0's answer reached it


def test_without_rank_0_the_others_say_so(server):
    got = _attempt(server, 2, ranks=[1], timeout_s=0.5)
    assert "rank 1 waited" in str(got[1]) and "rank 0 never arrived" in str(got[1]), got


@pytest.mark.parametrize("argv, expected", [
    (["/venv/bin/python", "-u", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "2",
      "--master_port", "29500", "pretrain_gpt.py", "--rdzv-backend", "c10d"], ("static", 1)),
    (["/venv/bin/torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
      "--rdzv-endpoint", "127.0.0.1:29500", "pretrain_gpt.py"], ("c10d", 2)),
    (["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "x.py"], ("c10d", 1)),
    (["python", "-m", "torch.distributed.run", "--nnodes", "1:4", "x.py"], ("static", 4)),
    (["python", "pretrain_gpt.py", "--nnodes", "2"], None),
])
def test_the_launchers_rendezvous_is_read_as_torchrun_parses_it(argv, expected):
    assert torchrun_rendezvous(argv) == expected


def test_restarts_over_static_nodes_are_refused_and_the_rest_allowed():
    env = {"TORCHELASTIC_MAX_RESTARTS": "2"}
    line = restart_refusal(env, launcher=("static", 2))
    assert "--rdzv-backend c10d" in line and "--max-restarts 2 over 2 nodes" in line
    assert restart_refusal(env, launcher=("static", 1)) is None  # one agent restarts all its workers
    assert restart_refusal(env, launcher=("c10d", 2)) is None
    assert restart_refusal({"TORCHELASTIC_MAX_RESTARTS": "0"}, launcher=("static", 2)) is None


def test_a_refused_connection_is_a_dead_peer_not_a_timeout():
    from patches.diagnostics.collective_timeouts import is_lost_peer

    # gloo's words when a restarted rank dialled the killed attempt's address (from a real run's output)
    refused = RuntimeError("Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] "
                           "timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:21921$1")
    stalled = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms "
                           "for recv operation to complete")
    assert is_lost_peer(refused) and not is_lost_peer(stalled)
