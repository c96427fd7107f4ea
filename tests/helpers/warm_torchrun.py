"""``torchrun`` for the tools the tests run, served by the session's zygote (helpers/zygote.py).

The tools that start distributed workers (check_hf_parity.py, check_vision_parity.py, the re-layout of
safetensors_ckpt.py) take their launcher from ``ADAPTOR_TORCHRUN``; a warm tool run of the suite sets
it to this script and ``ADAPTOR_TEST_ZYGOTE_SOCKET`` to a zygote's socket. It takes torchrun's
``--nproc_per_node``/``--master_port`` and the script with its arguments, hands the ranks this
process's own stdout and stderr, and exits as torchrun does (0, or 1 when a rank failed, naming the
first). Without a socket, or when the zygote refuses the environment, it becomes the real torchrun.
Only the standard library is imported here: the point is to start in milliseconds.
"""
from __future__ import annotations

import json
import os
import socket
import sys


SINGLE_NODE = {("--nnodes", "1"), ("--node_rank", "0"), ("--node-rank", "0"), ("--master_addr", "localhost"),
               ("--master_addr", "127.0.0.1"), ("--master-addr", "localhost"), ("--master-addr", "127.0.0.1")}


def _parse(argv: list[str]) -> tuple[int, int, str, list[str]]:
    nproc, port, rest = 1, 29500, list(argv)
    while rest and rest[0].startswith("--"):
        flag = rest.pop(0)
        name, _, value = flag.partition("=")
        if not value:
            value = rest.pop(0)
        if name in ("--nproc_per_node", "--nproc-per-node"):
            nproc = int(value)
        elif name in ("--master_port", "--master-port"):
            port = int(value)
        elif (name, value) in SINGLE_NODE:  # the example scripts' layout flags, on one node
            continue
        else:
            raise SystemExit(f"warm_torchrun.py: {name} is not supported here")
    return nproc, port, rest[0], rest[1:]


def _torchrun() -> None:
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *sys.argv[1:]])


def main() -> None:
    path = os.environ.get("ADAPTOR_TEST_ZYGOTE_SOCKET")
    if not path:
        _torchrun()
    nproc, port, script, args = _parse(sys.argv[1:])
    request = {"script": script, "code": None, "argv": args, "env": dict(os.environ), "cwd": os.getcwd(),
               "nproc": nproc, "launcher": "torchrun", "master_port": port}
    sys.stdout.flush()
    sys.stderr.flush()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(path)
        except OSError:
            _torchrun()
        socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], [1, 2])
        replies = conn.makefile("r")
        if "refused" in json.loads(replies.readline() or '{"refused": "closed"}'):
            _torchrun()
        report = json.loads(replies.readline() or '{"exitcodes": [-9], "first_failure": null}')
    failure = report.get("first_failure")
    if failure:
        print(f"warm_torchrun.py: rank {failure[0]} failed first, exit code {failure[1]}", file=sys.stderr)
    sys.exit(0 if all(code == 0 for code in report["exitcodes"]) else 1)


if __name__ == "__main__":
    main()
