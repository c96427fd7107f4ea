"""adaptor.rendezvous: ports for torchrun that no outgoing connection, listener or other picker takes first."""
from __future__ import annotations

import socket
import subprocess
import sys

from adaptor import rendezvous
from helpers.paths import ROOT


def test_ports_come_from_outside_the_kernels_own_range():
    span = rendezvous.candidate_span(rendezvous.ephemeral_range())
    low, high = rendezvous.ephemeral_range()
    ports = [rendezvous.rendezvous_port() for _ in range(50)]
    assert len(set(ports)) == 50, "a process never hands the same port out twice in a row"
    assert all(p in span and not low <= p <= high for p in ports), ports


def test_span_below_else_above_the_ephemeral_range():
    assert rendezvous.candidate_span((32768, 60999)) == range(10000, 32768)
    assert rendezvous.candidate_span((10500, 60000)) == range(60001, 65536)
    assert rendezvous.candidate_span((1024, 65000)) is None  # then the kernel picks
    assert rendezvous.candidate_span(None) is None


def test_a_port_someone_listens_on_is_skipped(monkeypatch):
    span = rendezvous.candidate_span(rendezvous.ephemeral_range())
    with socket.socket() as listener:
        for port in span:  # a port of the span nothing holds yet
            try:
                listener.bind(("0.0.0.0", port))
                break
            except OSError:
                continue
        listener.listen()
        monkeypatch.setattr(rendezvous, "_cursor", span.index(port))
        assert rendezvous.rendezvous_port() != port


def test_processes_picking_at_once_never_share_a_port(monkeypatch):
    """Several processes started on the same cursor: the lock files make each take a different port."""
    code = ("import sys; from adaptor import rendezvous as r; r._cursor = 0; "
            "print(*[r.rendezvous_port() for _ in range(20)]); sys.stdout.flush(); sys.stdin.read()")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    picked = [p.stdout.readline().split() for p in procs]  # all alive, all holding their locks
    for p in procs:
        p.communicate("")
    ports = [port for row in picked for port in row]
    assert len(ports) == 80 and len(set(ports)) == 80, picked
