"""The pytest plugin (issue 13, point 5), run as users run it: ``pytest --toggleshim-check`` in a fresh
process on a small project of their own. Passing and failing (a conftest that installs a wrong toggle),
once per session under xdist, opt-in and cheap to load without the flag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _fixtures import torch_properties_that_apply

from toggleshim.testing import installed_flavours

ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TOGGLESHIM_", "HYPOTHESIS_"))}
USER_TEST = "def test_users_own_code():\n    assert 1 + 1 == 2\n"
# a Lightning release that changed toggling: toggled parameters forced trainable (the mutant looks
# like Lightning's own method, as a new release's would)
WRONG_TOGGLE = "from toggleshim.testing import mutants\nmutants.apply('toggle unfreezes user-frozen parameters')\n"


def project(tmp_path: Path, conftest: str = "") -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "test_user.py").write_text(USER_TEST)
    if conftest:
        (tmp_path / "conftest.py").write_text(conftest)
    return tmp_path


def pytest_in(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=path, capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip


def test_plugin_fails_the_session_on_a_mismatch_with_the_counterexample(tmp_path: Path) -> None:
    proc = pytest_in(project(tmp_path, WRONG_TOGGLE), "--toggleshim-check", "--toggleshim-check-examples", "5",
                     "--toggleshim-check-flavour", "lightning.pytorch")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # although the user's test passed
    assert "1 passed" in proc.stdout
    summary = proc.stdout.split("toggleshim check", 1)[1]
    assert "MISMATCH" in summary and "trainable" in summary
    assert "Reproduce with:" in summary and "spec = WorldSpec(" in summary
    assert "NOT verified" in summary  # the gate had given that Lightning the fallback


def test_plugin_passes_on_the_installed_lightning_once_under_xdist(tmp_path: Path) -> None:
    """Every installed flavour, checked once in the controller (the workers run the user's tests)."""
    proc = pytest_in(project(tmp_path), "-n", "2", "--toggleshim-check", "--toggleshim-check-examples", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("toggleshim check: toggleshim") == 1
    summary = proc.stdout.split("toggleshim check", 1)[1]
    assert "1 passed" in proc.stdout and "OK:" in summary and "toggle code verified" in summary
    assert all(f"  {name}" in summary for name in installed_flavours())
    assert "GPU available" not in proc.stdout + proc.stderr


def test_plugin_is_opt_in_and_cheap_without_the_flag(tmp_path: Path) -> None:
    conftest = (
        "import sys\n"
        "def pytest_sessionfinish(session):\n"
        "    heavy = [m for m in ('torch', 'toggleshim', 'lightning', 'pytorch_lightning') if m in sys.modules]\n"
        "    print('HEAVY', heavy)\n"
    )
    proc = pytest_in(project(tmp_path, conftest), "-s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "HEAVY []" in proc.stdout and "toggleshim check" not in proc.stdout
    helped = pytest_in(tmp_path, "--help")
    assert "toggleshim" in helped.stdout and "--toggleshim-check" in helped.stdout


def test_plugin_bad_examples_is_a_usage_error(tmp_path: Path) -> None:
    proc = pytest_in(project(tmp_path), "--toggleshim-check", "--toggleshim-check-examples", "0")
    assert proc.returncode == 4 and "at least 1" in proc.stderr


def test_an_unknown_flavour_is_a_usage_error_naming_the_known_ones(tmp_path: Path) -> None:
    from toggleshim._flavours import NAMES

    proc = pytest_in(project(tmp_path), "--toggleshim-check", "--toggleshim-check-flavour", "lightning")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "--toggleshim-check-flavour lightning" in proc.stderr and all(n in proc.stderr for n in NAMES)


def test_plugin_strict_fails_the_session_on_unverified_code(tmp_path: Path) -> None:
    """``--toggleshim-check-strict`` (the check implied): on a Lightning with a no-op line in its toggle
    code (unverified, every property passes) the session fails although every test passed; the plain
    check passes it, naming the choices in both."""
    from _fake_release import NO_OP, release_tree, user_env

    release = release_tree(tmp_path / "release", "lightning.pytorch", (NO_OP,), "2.7.0")
    work = project(tmp_path / "project")
    args = ["--toggleshim-check-examples", "2", "--toggleshim-check-flavour", "lightning.pytorch"]
    env = user_env(release)
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", flag, *args], cwd=work,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for flag in ("--toggleshim-check-strict", "--toggleshim-check")]  # at once: each a fresh session
    outputs = [p.communicate(timeout=300) for p in procs]
    strict, plain = (subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs))
    assert strict.returncode == 1 and plain.returncode == 0, strict.stdout + plain.stdout
    for proc in (strict, plain):
        assert "1 passed" in proc.stdout
        summary = proc.stdout.split("toggleshim check", 1)[1]
        assert "Your choices:" in summary and "python -m toggleshim certify" in summary
    assert "FAILED (--strict)" in strict.stdout and f"OK: {6 + torch_properties_that_apply()} passed" in plain.stdout
