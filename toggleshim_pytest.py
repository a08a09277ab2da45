"""pytest plugin: ``pytest --toggleshim-check`` runs ``python -m toggleshim check`` once in your own test
session and fails the session when toggling on the installed Lightning is not what toggleshim expects.

Registered by the ``pytest11`` entry point ``toggleshim``, so pytest loads it in every session of
every environment where toggleshim is installed: it is a top-level module (importing the
``toggleshim`` package would import torch and patch Lightning) that imports nothing but pytest until
the opt-in flag is given. ``-p no:toggleshim`` switches it off entirely.

With the flag, the check runs once, at the end of the session (so it never changes what your tests
see), in the controller process only under pytest-xdist. Its report is a section of the terminal
summary; on a mismatch it holds the counterexample as a runnable snippet and the session's exit
status is 1 even when every test passed. ``--toggleshim-check-strict`` (which implies the check) also
fails the session on toggle code toggleshim has not verified (``check --strict``).
"""

from __future__ import annotations

import io
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("toggleshim", "toggleshim (does toggling on the installed Lightning behave as expected?)")
    group.addoption(
        "--toggleshim-check",
        action="store_true",
        default=False,
        help="run `python -m toggleshim check` once in this session; fail the session on a mismatch",
    )
    group.addoption(
        "--toggleshim-check-examples",
        type=int,
        default=50,
        metavar="N",
        help="random worlds a property for --toggleshim-check (default 50)",
    )
    group.addoption(
        "--toggleshim-check-strict",
        action="store_true",
        default=False,
        help="--toggleshim-check, and fail the session also where a flavour's toggle code is not one toggleshim "
        "verified (or certified for this project), even when every property passes",
    )
    group.addoption(
        "--toggleshim-check-flavour",
        action="append",
        metavar="NAME",
        help="only this Lightning flavour, by its import name (repeatable; default: every installed one)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # xdist workers carry `workerinput`: the check runs in the controller only.
    wanted = config.getoption("toggleshim_check") or config.getoption("toggleshim_check_strict")
    if wanted and not hasattr(config, "workerinput"):
        if config.getoption("toggleshim_check_examples") < 1:
            raise pytest.UsageError("--toggleshim-check-examples must be at least 1")
        from toggleshim._flavours import NAMES  # the flag was given: importing toggleshim is the point

        for name in config.getoption("toggleshim_check_flavour") or ():
            if name not in NAMES:
                raise pytest.UsageError(f"--toggleshim-check-flavour {name}: not a Lightning flavour; one of: "
                                        f"{', '.join(NAMES)}")
        config.pluginmanager.register(_SessionCheck(config), "toggleshim-check")


class _SessionCheck:
    """Runs the check at the end of the session, reports it, and sets the exit status."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.status: int | None = None
        self.text = ""

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR):
            return
        from toggleshim.__main__ import UsageError, run_check

        out = io.StringIO()
        try:
            self.status, _ = run_check(
                self.config.getoption("toggleshim_check_examples"),
                0,
                self.config.getoption("toggleshim_check_flavour"),
                None,
                out,
                strict=self.config.getoption("toggleshim_check_strict"),
            )
        except UsageError as exc:
            out.write(f"toggleshim check could not run: {exc}\n")
            self.status = 1
        self.text = out.getvalue()
        if self.status and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.status is None:
            return
        terminalreporter.section("toggleshim check", sep="=", red=bool(self.status), green=not self.status)
        terminalreporter.write(self.text)
