"""The warm launcher's server: imports torch and Megatron once, then forks each rank of each run.

A cold ``torchrun pretrain_gpt.py`` rank spends about 6 s of one core importing torch and Megatron
before it reads its first argument; the suite starts hundreds of such ranks. This process pays that
once: it imports the third-party modules every run imports (``PRELOAD``), then waits on a Unix
socket. For each request it forks an *agent* (torchrun's role: a session of its own, one child per
rank, torchrun's environment variables, the first failure ends the others) and goes back to waiting.
Each rank then runs the entry script with ``runpy`` as ``python script.py`` would, and ends as Python's
shutdown would (non-daemon threads joined, atexit handlers run, streams flushed, the same exit status)
without tearing its modules down (``leave``).

Why a forked rank starts as a fresh one would (helpers/warm_launcher.py asserts each point per run,
tests/unit/test_warm_launcher.py shows them):

* nothing of ours is imported here: ``adaptor``, ``patches``, the entry files and the tools are
  imported, and the patches applied, inside each rank from its own command line and environment;
* no thread exists at fork (``/proc/self/task`` is counted before every fork): no lock is held, no
  OpenMP pool is half-copied;
* no process group or device was touched here: imports, and two caches of machine facts torch's
  compiler keeps (``warm_machine_facts``); each rank draws fresh seeds for
  torch's and numpy's default generators (Python's ``random`` reseeds itself at fork), as a fresh
  interpreter draws them at import;
* the rank's environment is the request's, whole, plus torchrun's variables and what the imports
  here set (inductor's cache directory); a request whose variables would have changed what was
  imported here (``IMPORT_TIME_PREFIXES``) is refused (the client asks a zygote started with them).

What differs from torchrun, and why it does not matter here: ranks share the zygote's str-hash seed
(as ranks launched with one ``PYTHONHASHSEED`` would); rank 0 hosts the rendezvous store itself (no
``TORCHELASTIC_USE_AGENT_STORE``, as a plain ``python`` launch with ``env://`` does); there is no
per-rank error file (``TORCHELASTIC_ERROR_FILE``), since nothing here reads one. The tests that
prove launcher behaviour (a late rank 0, hangs, a killed rank, rlimits) launch cold.

Run as ``python zygote.py SOCKET``; prints ``ready`` once the imports are done.
"""
from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import time

# What every pretrain_gpt.py / pretrain_mm.py rank imports before its first step (measured with
# sys.modules at exit), third-party only: the modules of this repository are imported in the rank.
PRELOAD = (
    "numpy", "yaml", "jinja2", "safetensors", "safetensors.torch", "tokenizers", "psutil", "wrapt", "einops",
    "torch", "torch.distributed", "torch.distributed.checkpoint", "torch.distributed.tensor",
    "torch.distributed.fsdp", "torch.utils.data", "torch.utils.checkpoint",
    "transformers",
    "megatron.core", "megatron.core.parallel_state", "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs", "megatron.core.transformer.multi_token_prediction",
    "megatron.core.transformer.pipeline_parallel_layer_layout", "megatron.core.datasets.gpt_dataset",
    "megatron.core.datasets.blended_megatron_dataset_builder", "megatron.core.dist_checkpointing",
    "megatron.core.distributed", "megatron.core.optimizer", "megatron.core.pipeline_parallel",
    "megatron.core.models.multimodal.llava_model", "megatron.core.models.vision.clip_vit_model",
    "megatron.training", "megatron.training.training", "megatron.training.arguments",
    "megatron.training.argument_utils", "megatron.training.checkpointing", "megatron.training.initialize",
    "megatron.training.utils",
    # imported by the first step's work, not by the entry file: Megatron's tokenizer classes (with
    # transformers' model registry), the dataset index helpers, and torch's compiler backend for the
    # ``torch.compile``d fusions Megatron warms up before training
    "megatron.core.tokenizers.text", "megatron.core.datasets.helpers", "megatron.core.models.mimo",
    "torch._dynamo.backends.inductor", "torch._inductor.compile_fx", "torch.export._trace",
    "torch._inductor.fx_passes.pad_mm", "torch._inductor.fx_passes.fuse_attention",
    "torch._inductor.codegen.wrapper_fxir", "torch._inductor.runtime.caching",
)

#: ``user`` in a zygote's environment: it preloads none of Megatron (what a user's fresh process has
#: when its first statement, ``import adaptor``, runs: nothing), so in each rank ``import adaptor``
#: comes before Megatron's modules and the patches of modules not imported yet wait for them through
#: the patch manager's import hooks, as they do on the user's path. The default zygote preloads
#: Megatron, and every patch finds its module already there.
ORDER_VARIABLE = "ADAPTOR_TEST_IMPORT_ORDER"


def preload_for(env: dict) -> tuple[str, ...]:
    """The modules a zygote with ``env`` imports before its first fork."""
    if env.get(ORDER_VARIABLE) == "user":
        return tuple(name for name in PRELOAD if name.split(".")[0] != "megatron")
    return PRELOAD


# Variables read while the modules above are imported: a request that sets any of them differently
# from this process's environment cannot be served warm.
IMPORT_TIME_PREFIXES = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "CUDA", "NVTE_", "LD_", "HF_",
                        "TRANSFORMERS_", "TOKENIZERS_", "MEGATRON")
IMPORT_TIME_EXCEPT = ("PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "TORCHELASTIC_ERROR_FILE")

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE",
                      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID")

# How long the other ranks get after the first failure before SIGKILL (torchrun waits 30 s by default;
# a rank blocked in a collective never returns from SIGTERM's default action, so shorter is enough).
STOP_GRACE = 10.0


def import_time_variables(env: dict) -> dict:
    """The variables of ``env`` that the imports here may read."""
    return {k: v for k, v in env.items()
            if (k.startswith(IMPORT_TIME_PREFIXES) and k not in IMPORT_TIME_EXCEPT) or k == ORDER_VARIABLE}


def import_time_mismatch_between(env: dict, other: dict) -> list[str]:
    """The import-time variables on which two environments differ."""
    mine, theirs = import_time_variables(env), import_time_variables(other)
    return sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))


# This process's environment before the imports, and what the imports set in it (torch's inductor
# names its cache directory, for one): a rank starts from the request's environment plus those effects.
STARTING_ENV = dict(os.environ)
IMPORT_EFFECTS: dict[str, str | None] = {}


def import_time_mismatch(env: dict) -> list[str]:
    """The import-time variables on which ``env`` and this process's starting environment differ."""
    return import_time_mismatch_between(env, STARTING_ENV)


def record_import_effects() -> None:
    for name in {*STARTING_ENV, *os.environ}:
        if STARTING_ENV.get(name) != os.environ.get(name):
            IMPORT_EFFECTS[name] = os.environ.get(name)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("request cut short")
        data += more
    return json.loads(data), fds


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def serve(path: str):
    """Answer requests until the parent goes away; returns only inside a rank, with its job."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # agents are reaped by the kernel
    print("ready", flush=True)
    while True:
        server.settimeout(5.0)
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test session ended without saying so
                return None
            continue
        conn.settimeout(60)
        try:
            request, fds = _recv_request(conn)
        except (OSError, ValueError):  # a client that went away, or no request: the next one
            conn.close()
            continue
        conn.settimeout(None)
        if request.get("stop"):
            conn.close()
            return None
        mismatch = import_time_mismatch(request["env"])
        threads = thread_count()
        if mismatch or threads != 1:
            _send(conn, {"refused": f"import-time variables differ: {mismatch}" if mismatch
                         else f"{threads} threads in the zygote"})
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return _agent(request, fds, conn, threads)
        for fd in fds:
            os.close(fd)
        conn.close()


def _agent(request: dict, fds: list[int], conn: socket.socket, threads_at_fork: int):
    """torchrun's part for one run: fork the ranks, watch them, report each exit status."""
    os.setsid()
    nproc = request["nproc"]
    _send(conn, {"pid": os.getpid(), "threads_at_fork": threads_at_fork})
    ranks: dict[int, int] = {}
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            conn.close()
            return _rank_job(request, fds, rank)
        ranks[pid] = rank
    for fd in fds:
        os.close(fd)
    exitcodes: dict[int, int] = {}
    first_failure = None
    deadline = None
    while len(exitcodes) < nproc:
        if deadline is not None and time.monotonic() > deadline:
            for pid, rank in ranks.items():
                if rank not in exitcodes:
                    _signal(pid, signal.SIGKILL)
            deadline = None
        pid, status = os.waitpid(-1, os.WNOHANG if deadline else 0)
        if pid == 0:
            time.sleep(0.05)
            continue
        rank = ranks[pid]
        exitcodes[rank] = os.waitstatus_to_exitcode(status)
        if exitcodes[rank] != 0 and first_failure is None:
            first_failure = (rank, exitcodes[rank])
            for other, other_rank in ranks.items():
                if other_rank not in exitcodes:
                    _signal(other, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
    _send(conn, {"exitcodes": [exitcodes[r] for r in range(nproc)], "first_failure": first_failure})
    conn.close()
    os._exit(0)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _rank_job(request: dict, fds: list[int], rank: int) -> dict:
    """Become one rank: its own output, directory, environment and command line."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    out, err = fds
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    env = dict(request["env"])
    env.pop(ORDER_VARIABLE, None)  # it chose this zygote; the rank's environment is the user's
    if request["launcher"] == "torchrun":
        nproc = request["nproc"]
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_NAME="default", ROLE_WORLD_SIZE=str(nproc),
                   GROUP_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(request["master_port"]),
                   TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0",
                   TORCHELASTIC_RUN_ID="none", TORCHELASTIC_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                   TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    for name, value in IMPORT_EFFECTS.items():
        if env.get(name) == STARTING_ENV.get(name):  # a fresh import, from this value, would have done this
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    _reseed()
    return request


def _reseed() -> None:
    """Draw the seeds a fresh interpreter draws at import from the OS, rank by rank: torch's default
    generator and numpy's global one (Python's ``random`` reseeds itself at fork)."""
    import numpy
    import torch

    numpy.random.seed()
    torch.seed()


def run_job(request: dict) -> None:
    """Run the entry script (or ``-c`` code) as ``__main__``, at the bottom of this process's stack."""
    import runpy

    if request["script"] == "-c":
        sys.argv = ["-c", *request["argv"]]
        sys.path[0] = ""
        code = compile(request["code"], "<string>", "exec")
        main = type(sys)("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        exec(code, main.__dict__)
    else:
        script = os.path.abspath(request["script"])
        sys.argv = [request["script"], *request["argv"]]
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")


def warm_machine_facts() -> None:
    """Fill two caches torch's compiler fills in every process that runs a ``torch.compile``d function
    (Megatron's fused SwiGLU and bias-dropout-add are): the CPU's vector instruction sets (found by
    compiling and running a C++ probe, under a file lock every process queues on) and the compiler's
    system key (a hash of the triton and torch installation). Both are facts of this machine and
    installation, the same in every process; computed here, each rank inherits them."""
    from torch._inductor import codecache, cpu_vec_isa

    cpu_vec_isa.valid_vec_isa_list()
    codecache.CacheBase.get_system()


def main() -> None:
    path = sys.argv[1]
    sys.argv = sys.argv[:1]
    # Import from where the entry files live, as their ranks do (tests/helpers holds a datasets.py).
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import importlib

    for name in preload_for(os.environ):
        importlib.import_module(name)
    if os.environ.get(ORDER_VARIABLE) == "user":  # the user's order holds only if nothing pulled Megatron in
        early = sorted(m for m in sys.modules if m.split(".")[0] in ("megatron", "adaptor", "patches"))
        if early:
            raise SystemExit(f"zygote in the user's import order preloaded {', '.join(early[:3])}")
    warm_machine_facts()
    record_import_effects()
    # What the imports made stays for the life of every rank: out of the cyclic collector's reach, a
    # rank's collections (and the ones at its exit, two seconds of a warm rank's life) walk only
    # what the rank itself makes. Python's gc docs advise freeze() before fork() in a pre-fork server.
    gc.collect()
    gc.freeze()
    job = serve(path)
    if job is not None:
        del path, name
        leave(run_rank(job))


def run_rank(job: dict) -> int:
    """Run the rank's script; the exit status Python would give it, its traceback printed as Python would."""
    try:
        run_job(job)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return (code or 0) & 0xFF
        print(code, file=sys.stderr)  # sys.exit("message")
        return 1
    except KeyboardInterrupt:
        return -signal.SIGINT  # Python dies by the signal, so its parent sees it
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def leave(code: int) -> None:
    """End the rank as interpreter shutdown would, up to its last step.

    Python's shutdown waits for the non-daemon threads, runs the atexit callbacks and flushes the standard
    streams; this does the same, in that order, then exits. What it skips is the teardown of every module
    and of what they hold: in a forked rank that walks the whole preloaded heap and copies its pages (about
    a second per rank), and no test reads anything it does (files are closed and flushed by their owners,
    or by atexit callbacks, which run). A fresh interpreter's shutdown is still what the cold runs get.
    """
    import atexit
    import threading

    try:
        threading._shutdown()
    except BaseException:  # noqa: BLE001  (shutdown goes on, as Python's does)
        sys.excepthook(*sys.exc_info())
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # Python's status when flushing stdout fails at exit
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


if __name__ == "__main__":
    main()
