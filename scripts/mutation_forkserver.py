"""A fork server for cosmic-ray's test command: torch imported once, a fresh forked child per mutant.

    python scripts/mutation_forkserver.py serve SOCKET            # started by standard_mutation.py
    python scripts/mutation_forkserver.py run SOCKET -- ARGS...   # cosmic-ray's test command

A mutant's test run costs 15-20 s in a fresh process, of which ~5-8 s is importing torch (with
dynamo), torchmetrics and pytest before the first test. The server imports those once
(``PRELOAD``); for each mutant, the client (a plain, fast ``python`` process: the test command
cosmic-ray runs and times out) sends its working directory, environment, arguments and its stdout
and stderr; the server forks a child that runs ``pytest.main(ARGS)`` there, as ``python -m pytest
ARGS`` would, and the client exits with pytest's exit status.

Same verdicts as the fresh process, by construction:

- Nothing of toggleshim is ever imported by the server, nor any Lightning flavour (``lightning``,
  ``pytorch_lightning``, ``lightning_fabric``) nor Hypothesis: the child imports them from the
  mutated copy in the order a fresh process does, so the patch goes through the same path
  (``_patch``'s import hook patches a flavour imported after toggleshim) and pytest rewrites the
  same modules' asserts. Importing them costs ~0.3 s, not worth a difference.
- The child puts its working directory first on ``sys.path`` (as ``python -m`` does), takes the
  client's environment (``os.environ`` and ``sys.dont_write_bytecode`` from cosmic-ray's
  ``PYTHONDONTWRITEBYTECODE``) and checks that ``toggleshim`` (and the ``toggleshim_pytest`` plugin)
  come from the working directory, before and after the tests; otherwise it exits with
  ``WRONG_TREE`` and the marker ``MARKER`` in its output (``standard_mutation.py`` stops on it).
- Each child is a fork of the same pristine server: no Hypothesis settings, profile or database
  carried from one mutant to the next (the conftest registers and loads the profile in the child).
- torch and fork: the server refuses to serve if any thread exists besides the main one (Python's
  or native, ``/proc/self/task``); ``OMP_NUM_THREADS=1`` is set before torch is imported and torch's
  intra-op pool is never started in the server.
- Timeouts: cosmic-ray kills the client's process group at its timeout and counts the mutant as
  killed ("timeout"); the server sees the client's connection close and kills the child's whole
  process group (the child leads its own session), so a mutant that loops forever is stopped too.

One mutant at a time (the server serves one connection after the other). The server exits when its
parent (``standard_mutation.py``) dies or on SIGTERM, killing the child it is running.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time

# Not Hypothesis (0.1 s): pytest rewrites the asserts of a plugin's distribution, which it cannot do
# once imported; not its pytest plugin either (its module code counts pytest's initialization)
PRELOAD = ("torch", "torch._dynamo", "torch._dynamo.eval_frame", "torchmetrics", "numpy", "pytest")
NEVER = ("toggleshim", "toggleshim_pytest", "lightning", "pytorch_lightning", "lightning_fabric")
MARKER = "toggleshim-forkserver-error:"
WRONG_TREE = 97


_running: list[int] = []  # the child now running, if any


def _stop(signum: int, frame: object) -> None:
    """SIGTERM (standard_mutation.py is done or stopped): the running child's group goes too."""
    for pid in _running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    os._exit(0)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve(path: str) -> int:
    os.environ["OMP_NUM_THREADS"] = "1"
    parent = os.getppid()
    start = time.perf_counter()
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(NEVER))
    if loaded:
        raise SystemExit(f"{MARKER} the preload imported {loaded}: the child must import them itself")
    import threading

    if threading.active_count() != 1 or _threads() != 1:
        raise SystemExit(f"{MARKER} {_threads()} threads after the preload: forking would be unsafe")
    base_path = list(sys.path[1:])  # sys.path[0] is this script's directory; a child puts its cwd there
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    server.settimeout(1.0)
    signal.signal(signal.SIGTERM, _stop)
    print(f"fork server ready on {path}: preloaded in {time.perf_counter() - start:.1f} s", flush=True)
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent:  # standard_mutation.py is gone
                return 0
            continue
        with conn:
            conn.settimeout(None)
            _handle(server, conn, base_path, parent)


def _receive(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    """The request (one JSON line) and the client's stdout and stderr (passed as file descriptors)."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("the client left before its request was complete")
        data += more
    return json.loads(data), fds


def _handle(server: socket.socket, conn: socket.socket, base_path: list[str], parent: int) -> None:
    try:
        request, fds = _receive(conn)
    except (ConnectionError, ValueError, OSError):
        return
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 70
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            server.close()
            conn.close()
            code = _child(request, fds, base_path)
        except BaseException as exc:
            os.write(2, f"{MARKER} {exc!r}\n".encode())
        finally:
            os._exit(code)
    _running.append(pid)
    for fd in fds:
        os.close(fd)
    status = _wait(pid, conn, parent)
    _running.remove(pid)
    if status is not None:
        with contextlib.suppress(OSError):
            conn.sendall(f"{status}\n".encode())


def _wait(pid: int, conn: socket.socket, parent: int) -> int | None:
    """The child's exit status; None when the client left first (cosmic-ray's timeout killed it):
    then the child's whole process group is killed (and so when the server's parent is gone)."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 128 + os.WTERMSIG(status)
        readable, _, _ = select.select([conn], [], [], 0.05)
        if (readable and not conn.recv(1)) or os.getppid() != parent:  # EOF: the client is gone
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None


def _child(request: dict[str, object], fds: list[int], base_path: list[str]) -> int:
    os.setsid()  # its own process group: killed as a whole
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, target in zip(fds, (1, 2)):
        os.dup2(fd, target)
    cwd = str(request["cwd"])
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(dict(request["env"]))  # type: ignore[call-overload]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.path[:] = [cwd, *base_path]  # as `python -m pytest` from cwd
    sys.argv = ["pytest", *request["args"]]  # type: ignore[misc]
    import importlib
    import importlib.util

    importlib.invalidate_caches()

    def check(when: str) -> str | None:
        for name in ("toggleshim", "toggleshim_pytest"):
            module = sys.modules.get(name)
            origin = module.__file__ if module is not None else getattr(importlib.util.find_spec(name), "origin", None)
            if not str(origin).startswith(cwd + os.sep):
                return f"{MARKER} {when}, {name} comes from {origin}, not from the mutated tree {cwd}"
        return None

    code = WRONG_TREE
    problem = check("before the tests")
    if problem is None:
        import pytest

        code = int(pytest.main(list(request["args"])))  # type: ignore[call-overload]
        problem = check("after the tests") if "toggleshim" in sys.modules else None
    if problem is not None:
        print(problem, file=sys.stderr, flush=True)
        return WRONG_TREE
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def run(path: str, args: list[str]) -> int:
    """The client: send the request, wait for the exit status (killed by cosmic-ray at its timeout)."""
    request = json.dumps({"cwd": os.getcwd(), "env": dict(os.environ), "args": args}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(path)
        except OSError as exc:
            print(f"{MARKER} no fork server on {path}: {exc}", file=sys.stderr)
            return 70
        socket.send_fds(conn, [request], [sys.stdout.fileno(), sys.stderr.fileno()])
        reply = b""
        while not reply.endswith(b"\n"):
            more = conn.recv(64)
            if not more:
                print(f"{MARKER} the server closed the connection without a status", file=sys.stderr)
                return 70
            reply += more
    return int(reply)


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        return serve(sys.argv[2])
    if len(sys.argv) >= 4 and sys.argv[1] == "run" and sys.argv[3] == "--":
        return run(sys.argv[2], sys.argv[4:])
    print(__doc__.strip().splitlines()[2:4], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
