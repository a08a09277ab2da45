"""scripts/mutation_forkserver.py, the fast runner of the standard mutation score: a child per run
that imports the package from the tree it runs in, pytest's exit status passed through, a client
killed at cosmic-ray's timeout taking its child down with it, and the server serving on.

Real processes: the server (torch preloaded, ~5 s, once for the module) and clients as cosmic-ray
starts them. The trees are tiny stand-ins with a ``toggleshim`` package of their own, so that where
the child imported it from is plain. (That its verdicts equal a fresh process's on real mutants is
``python scripts/standard_mutation.py --compare 24``, docs/dev/harness.md: minutes, not a unit test.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutation_forkserver.py"
sys.path.insert(0, str(SCRIPT.parent))
from mutation_forkserver import MARKER, WRONG_TREE  # type: ignore[import-not-found]  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("forkserver")
    sock, log = where / "fs.sock", where / "fs.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "serve", str(sock)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while "ready" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the fork server did not start"
            time.sleep(0.1)
        yield sock
    finally:
        proc.terminate()
        proc.wait(30)


def _tree(root: Path, test: str, package: bool = True) -> Path:
    root.mkdir()
    if package:
        (root / "toggleshim").mkdir()
        (root / "toggleshim" / "__init__.py").write_text("WHERE = __file__\n")
        (root / "toggleshim_pytest.py").write_text('"""the pytest11 plugin, from this tree"""\n')
    (root / "test_it.py").write_text(test)
    return root


def _client(sock: Path, tree: Path, **kwargs: object) -> subprocess.Popen[str]:
    # as cosmic-ray starts its test command: its own session, output piped
    return subprocess.Popen([sys.executable, str(SCRIPT), "run", str(sock), "--", "-q", "-p", "no:cacheprovider",
                             "test_it.py"], cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, **kwargs)


def test_the_child_imports_the_package_of_its_tree_and_returns_pytests_status(server: Path, tmp_path: Path) -> None:
    test = ("import os, sys, toggleshim, toggleshim_pytest\n"
            "def test_here():\n"
            "    assert toggleshim.WHERE == os.path.join(os.getcwd(), 'toggleshim', '__init__.py')\n"
            "    assert toggleshim_pytest.__file__ == os.path.join(os.getcwd(), 'toggleshim_pytest.py')\n"
            "    assert sys.dont_write_bytecode and os.environ['PYTHONDONTWRITEBYTECODE'] == '1'\n")
    passing = _tree(tmp_path / "a", test)
    proc = _client(server, passing)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "1 passed" in out, out + err
    failing = _tree(tmp_path / "b", test + "def test_mutant_caught():\n    assert False\n")
    proc = _client(server, failing)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "1 failed, 1 passed" in out, out + err
    assert not list(passing.rglob("__pycache__/toggleshim*")), "bytecode written for the mutated package"


def test_a_tree_without_the_package_is_a_runner_error_not_a_verdict(server: Path, tmp_path: Path) -> None:
    proc = _client(server, _tree(tmp_path / "c", "def test_x():\n    pass\n", package=False))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == WRONG_TREE, out + err
    assert MARKER in err and "toggleshim comes from" in err, err


def test_a_client_killed_at_the_timeout_takes_its_child_down(server: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    test = ("import os, time\n"
            "def test_forever():\n"
            f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "    while True:\n"
            "        time.sleep(0.01)\n")
    proc = _client(server, _tree(tmp_path / "d", test))
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.killpg(proc.pid, signal.SIGKILL)  # what cosmic-ray does at its timeout
    proc.communicate()
    deadline = time.monotonic() + 30
    while _alive(child):
        assert time.monotonic() < deadline, f"the looping child {child} outlived its client"
        time.sleep(0.05)
    # and the server serves the next mutant
    out, err = _client(server, _tree(tmp_path / "e", "def test_x():\n    pass\n")).communicate(timeout=120)
    assert "1 passed" in out, out + err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
