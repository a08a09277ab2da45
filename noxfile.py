"""Local version matrix: toggleshim against every supported Lightning release, both flavours.

    nox -s matrix                        # all sessions, then the table (printed)
    nox -s "matrix(lightning='2.0.9.post0', flavour='pytorch_lightning')"
    nox -s matrix --install-only         # build the venvs only
    nox -s matrix -- -k patch            # extra pytest arguments (after --)
    nox -s matrix_table                  # print the table of build/matrix/ again
    nice -n 10 python scripts/matrix_table.py check-all   # only `toggleshim check` in the built venvs, then the table
    nox -s canary -- /path/to/pytorch-lightning           # Lightning's unreleased code from a local checkout

Each session installs, in this order: torch (``TOGGLESHIM_TORCH``, default ``torch==2.13.0``, the
CPU build on this machine's disk; installing Lightning first would pull a multi-GB CUDA torch), the
flavour's Lightning distribution (``lightning`` or ``pytorch-lightning`` only) with the files in
``constraints/``, then toggleshim with its test tools. It runs ``pytest -n auto`` with
``TOGGLESHIM_FLAVOUR`` (``lightning.pytorch`` or ``pytorch_lightning``) and ``HYPOTHESIS_PROFILE``
(default ``dev``) set, then ``python -m toggleshim check`` when the package has a ``__main__``.
Results land in ``build/matrix/<session>/`` (meta.json, junit.xml, check.json, install.json) for
``scripts/matrix_table.py``. These sessions vary Lightning over one torch; docs/compatibility.md's
table is the torch x Lightning matrix of ``scripts/torch_matrix.py`` (a fresh venv a cell, every
claimed torch line with the oldest and the newest Lightning that accepts it).

Environment: ``TOGGLESHIM_TORCH`` (pip arguments for torch, e.g.
``"torch==2.5.1 --index-url https://download.pytorch.org/whl/cpu"``), ``TOGGLESHIM_PYTHON``
(interpreter, default 3.11), ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import nox
from nox.command import CommandFailed
from packaging.version import Version

ROOT = Path(__file__).parent
CONSTRAINTS = ROOT / "constraints"
BASE = CONSTRAINTS / "base.txt"
# Lightning < 2.4 imports pkg_resources: setuptools<81 (installed with -r, kept with -c).
LIGHTNING_LT_24 = CONSTRAINTS / "lightning-lt-2.4.txt"
# torch < 2.4 wheels were built against NumPy 1.x.
TORCH_LT_24 = CONSTRAINTS / "torch-lt-2.4.txt"
RESULTS = ROOT / "build" / "matrix"
RECORDER = ROOT / "scripts" / "matrix_table.py"

# The newest patch release of each minor line; 2.6.2 and 2.6.3 are withdrawn (see constraints/base.txt).
# Keep in step with the `lightning:` axis of .github/workflows/ci.yml (tests/test_workflow.py checks).
LIGHTNING_VERSIONS = ["2.0.9.post0", "2.1.4", "2.2.5", "2.3.3", "2.4.0", "2.5.6", "2.6.6"]
# flavour -> the module the tests exercise (the value of TOGGLESHIM_FLAVOUR, which
# toggleshim.testing.installed_flavours() reads), and the distributions installed, all at the
# session's version: `lightning` requires `pytorch-lightning` unversioned, so it is pinned beside it;
# the pytorch_lightning flavour gets the `pytorch-lightning` distribution only.
MODULES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}
DISTRIBUTIONS = {"lightning": ["lightning", "pytorch-lightning"], "pytorch_lightning": ["pytorch-lightning"]}

PYTHON = os.environ.get("TOGGLESHIM_PYTHON", "3.11")
TORCH_ARGS = shlex.split(os.environ.get("TOGGLESHIM_TORCH", "torch==2.13.0"))
TEST_TOOLS = ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100"]

nox.options.sessions = ["matrix"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True


def _slug(python: str, lightning: str, flavour: str) -> str:
    return f"py{python}-{flavour}-{lightning}"


def _record(session: nox.Session, out: Path, flavour: str, lightning: str, *extra: str) -> object:
    """Run ``scripts/matrix_table.py record`` in the session's venv (None under ``--install-only``)."""
    return session.run(
        "python", str(RECORDER), "record", "--dir", str(out), "--flavour", flavour, "--lightning", lightning,
        *extra, silent=True,
    )  # fmt: skip


def _installed_torch(session: nox.Session) -> str | None:
    """The torch version now in the venv (None when installs are skipped by ``--no-install``)."""
    out = session.run_install(
        "python", "-c", "import importlib.metadata as m; print(m.version('torch'))", silent=True
    )
    return out.strip().splitlines()[-1] if isinstance(out, str) else None


@nox.session(python=PYTHON)
@nox.parametrize(
    ("lightning", "flavour"),
    [(version, flavour) for version in LIGHTNING_VERSIONS for flavour in MODULES],
)
def matrix(session: nox.Session, lightning: str, flavour: str) -> None:
    """toggleshim's tests and check against one Lightning release and flavour."""
    session.notify("matrix_table")
    out = RESULTS / _slug(PYTHON, lightning, flavour)
    out.mkdir(parents=True, exist_ok=True)

    # Install. torch strictly first, and pinned afterwards to what was installed, so that no later
    # step can swap it for another build.
    started = time.monotonic()
    session.install(*TORCH_ARGS)
    torch_version = _installed_torch(session)
    torch_pin = [f"torch=={torch_version}"] if torch_version else []
    constraints = ["-c", str(BASE)]
    extra_requirements: list[str] = []
    if Version(lightning) < Version("2.4"):
        extra_requirements += ["-r", str(LIGHTNING_LT_24)]
        constraints += ["-c", str(LIGHTNING_LT_24)]
    if torch_version and Version(torch_version) < Version("2.4"):
        constraints += ["-c", str(TORCH_LT_24)]
    # Without the pytorch-lightning pin, lightning 2.0 would come with pytorch-lightning 2.6.
    lightning_reqs = [f"{dist}=={lightning}" for dist in DISTRIBUTIONS[flavour]]
    session.install(*lightning_reqs, *torch_pin, *extra_requirements, *constraints)
    session.install("-e", ".[dev]", *TEST_TOOLS, *lightning_reqs, *torch_pin, *constraints)
    install_seconds = round(time.monotonic() - started, 1)
    if torch_version is not None:  # a real install happened (not --no-install on a reused venv)
        (out / "install.json").write_text(
            json.dumps({"seconds": install_seconds, "torch": torch_version}, indent=2) + "\n"
        )

    env = {
        "TOGGLESHIM_FLAVOUR": MODULES[flavour],
        "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "dev"),
    }
    junit = out / "junit.xml"
    check_json = out / "check.json"
    for stale in (junit, check_json, out / "meta.json"):
        stale.unlink(missing_ok=True)

    # Record what is installed (and refuse a flavour whose env holds the other distribution). Under
    # --install-only, session.run does nothing and returns None: stop here.
    if _record(session, out, flavour, lightning) is None:
        session.log(f"installed in {install_seconds} s (torch {torch_version})")
        return

    # Collect results even when tests fail: run everything, then fail the session at the end.
    failures: list[str] = []
    pytest_exit = 0
    try:
        session.run("python", "-m", "pytest", "-n", "auto", f"--junitxml={junit}", *session.posargs, env=env)
    except CommandFailed as exc:
        pytest_exit = exc.return_code if exc.return_code is not None else -1
        failures.append(f"pytest exited {pytest_exit}")

    check_exit: int | None = None
    if (ROOT / "toggleshim" / "__main__.py").exists():
        try:
            session.run("python", "-m", "toggleshim", "check", "--json", str(check_json), env=env)
            check_exit = 0
        except CommandFailed as exc:
            check_exit = exc.return_code if exc.return_code is not None else -1
            failures.append(f"toggleshim check exited {check_exit}")
    else:
        session.log("toggleshim has no __main__ yet: `python -m toggleshim check` skipped")

    check_args = ["--check-exit", str(check_exit)] if check_exit is not None else []
    _record(session, out, flavour, lightning, "--pytest-exit", str(pytest_exit), *check_args)
    if failures:  # CommandFailed marks the session "failed" (session.error would say "aborted")
        raise CommandFailed("; ".join(failures))


@nox.session(venv_backend="none")
def matrix_table(session: nox.Session) -> None:
    """Print the table of the results in build/matrix/ (docs/compatibility.md's is scripts/torch_matrix.py's)."""
    session.run(
        sys.executable, str(RECORDER), "table", "--results", str(RESULTS), "--results-label", "build/matrix",
        "--command-label", "`nox -s matrix` (pytest -n auto with HYPOTHESIS_PROFILE=dev, "
        "then `python -m toggleshim check`, in each venv)",
    )  # fmt: skip


# Lightning's source tree, as much as its setup.py needs (tests, docs and examples are never copied).
_CHECKOUT_SKIP = shutil.ignore_patterns(
    ".git", "tests", "docs", "examples", "_notebooks", "dockers", "build", "*.egg-info"
)


def _staged_lightning(session: nox.Session, checkout: Path) -> Path:
    """A copy of ``checkout`` to build Lightning from (pip builds in the source tree; the user's checkout
    stays untouched), relabelled ``<version.info>.post1.dev0+canary``: an unreleased main branch may
    still carry the last release's number (master said 2.6.2 on 2026-07-20, a withdrawn release that
    constraints/base.txt refuses), and it is not that release."""
    staged = Path(session.create_tmp()) / "lightning-src"
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(checkout, staged, ignore=_CHECKOUT_SKIP)
    info = staged / "src" / "version.info"
    version = info.read_text().strip()
    info.write_text(f"{version}.post1.dev0+canary\n")
    session.log(f"Lightning from {checkout} (version.info {version}), staged in {staged}")
    return staged


@nox.session(python=PYTHON)
def canary(session: nox.Session) -> None:
    """Lightning's unreleased code: `nox -s canary -- /path/to/pytorch-lightning [pytest arguments]`.

    Builds both flavours (``pytorch-lightning`` then ``lightning``) from a local checkout of Lightning's
    repository (a copy of it; the checkout is never written to), then runs: the fingerprint comparison
    (``scripts/fingerprints.py --checkout``: is its toggle code verified?), toggleshim's tests (pytest
    arguments after the path; default: all) and ``python -m toggleshim check``. Fails if any of them
    fails: then a change to toggling is seen before Lightning releases it. The scheduled workflow
    (.github/workflows/canary.yml) runs this session on Lightning's main branch.
    """
    if not session.posargs:
        session.error("usage: nox -s canary -- /path/to/pytorch-lightning-checkout [pytest arguments]")
    checkout = Path(session.posargs[0]).expanduser().resolve()
    if not (checkout / "src" / "lightning" / "pytorch" / "core" / "module.py").is_file():
        session.error(
            f"{checkout} is not a checkout of Lightning's repository (no src/lightning/pytorch/core/module.py)"
        )
    out = RESULTS / "canary"
    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []

    # 1. Toggle code verified? Text only: runs before anything is built.
    try:
        session.run("python", str(ROOT / "scripts" / "fingerprints.py"), "--checkout", str(checkout))
    except CommandFailed:
        failures.append("its toggle code is not verified (scripts/fingerprints.py --checkout)")

    # 2. Install: torch first and pinned, both flavours from the staged copy, toggleshim.
    session.install(*TORCH_ARGS)
    torch_version = _installed_torch(session)
    torch_pin = [f"torch=={torch_version}"] if torch_version else []
    staged = _staged_lightning(session, checkout)
    for package in ("pytorch", "lightning"):  # `lightning` requires `pytorch-lightning`: the staged one
        session.install(str(staged), *torch_pin, "-c", str(BASE), env={"PACKAGE_NAME": package})
    session.install("-e", ".[dev]", *TEST_TOOLS, *torch_pin, "-c", str(BASE))
    if torch_version is None:  # --install-only
        return
    session.run("python", "-m", "pip", "list")

    # 3. The tests and the check, on both flavours.
    env = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "dev")}
    try:
        session.run("python", "-m", "pytest", "-n", "auto", f"--junitxml={out / 'junit.xml'}", *session.posargs[1:],
                    env=env)
    except CommandFailed as exc:
        failures.append(f"pytest exited {exc.return_code}")
    try:
        session.run("python", "-m", "toggleshim", "check", "--json", str(out / "check.json"), env=env)
    except CommandFailed as exc:
        failures.append(f"toggleshim check exited {exc.return_code}")
    if failures:
        raise CommandFailed("; ".join(failures))
