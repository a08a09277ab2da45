"""pytest plugin that ``scripts/lightning_suite.py`` loads into Lightning's own test suite.

Not meant to be used on its own: the runner sets these environment variables and passes
``-p lightning_suite_plugin`` (with ``scripts/`` on ``PYTHONPATH``) to every pytest it starts.

``TOGGLESHIM_SUITE_MODE``
    ``shim`` (import toggleshim, check it is active) or ``baseline`` (check it is *not* imported).
``TOGGLESHIM_SUITE_FLAVOUR``
    ``lightning.pytorch`` or ``pytorch_lightning``: the flavour the staged tests import.
``TOGGLESHIM_SUITE_IMPORT_ORDER``
    ``lightning-first`` (default; Lightning's conftest imports the flavour, then toggleshim is imported,
    the order ``isort`` gives user code) or ``shim-first`` (toggleshim imported when this plugin loads,
    before anything of Lightning).
``TOGGLESHIM_SUITE_OUT``
    Directory where every pytest process (main, xdist workers, DDP children) writes ``proc-<pid>.json``.
``TOGGLESHIM_SUITE_CPU_PORT``
    Comma-separated test function names that Lightning gates on CUDA GPUs but that exercise toggling:
    their ``RunIf`` skip is lifted and, for them only, ``Trainer(accelerator="gpu")`` becomes ``"cpu"``
    and ``precision="16-mixed"`` becomes ``"bf16-mixed"`` (CPU autocast has no fp16 grad scaler).
``TOGGLESHIM_SUITE_STANDALONE``
    The subset of those that use the ``ddp`` launcher (it re-runs the pytest command line for the other
    ranks): they must run alone, so their skip is never lifted inside an xdist worker.

What it records, per process: every test's outcome, and how many toggleshim ``Toggle`` objects each
test created (so the report can show that Lightning's toggle tests really went through the shim).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

_MODE = os.environ.get("TOGGLESHIM_SUITE_MODE", "shim")
_FLAVOUR = os.environ.get("TOGGLESHIM_SUITE_FLAVOUR", "lightning.pytorch")
_ORDER = os.environ.get("TOGGLESHIM_SUITE_IMPORT_ORDER", "lightning-first")
_OUT = os.environ.get("TOGGLESHIM_SUITE_OUT", "")
_CPU_PORT = {name for name in os.environ.get("TOGGLESHIM_SUITE_CPU_PORT", "").split(",") if name}
_STANDALONE = {name for name in os.environ.get("TOGGLESHIM_SUITE_STANDALONE", "").split(",") if name}
_SENTINEL = "_toggleshim_original"

_toggles = [0]  # Toggle objects created in this process
_per_test: dict[str, int] = {}
_outcomes: dict[str, str] = {}
_problems: list[str] = []
_ported: list[str] = []


def _import_shim() -> None:
    import toggleshim
    from toggleshim import _block

    # Every Toggle is made by _block._new (looked up in the module's globals at each toggle, also by
    # the copies of the toggle installed as toggle_optimizer): count there.
    original_new = _block._new
    if getattr(original_new, "_suite_counting", False):
        return

    def counting_new(cls: Any) -> Any:
        if cls is _block.Toggle:
            _toggles[0] += 1
        return original_new(cls)

    counting_new._suite_counting = True  # type: ignore[attr-defined]
    _block._new = counting_new
    assert toggleshim.__name__ == "toggleshim"


if _MODE == "shim" and _ORDER == "shim-first":
    _import_shim()


def _module_cls() -> Any:
    return importlib.import_module(_FLAVOUR).LightningModule


def _shim_state() -> str:
    """``patched`` / ``original`` / a description of anything else, for the flavour under test."""
    cls_dict = vars(_module_cls())
    marks = [hasattr(cls_dict.get(name), _SENTINEL) for name in ("toggle_optimizer", "untoggle_optimizer")]
    if all(marks):
        return "patched"
    if not any(marks):
        return "original"
    return f"half-patched {marks}"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("rerunfailures"):
        # Lightning marks a few tests @pytest.mark.flaky (pytest-rerunfailures) and runs --strict-markers.
        config.addinivalue_line("markers", "flaky(reruns=1): rerun marker of pytest-rerunfailures (ignored)")
    if _MODE == "shim":
        importlib.import_module(_FLAVOUR)  # normally already imported by Lightning's conftest
        _import_shim()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    in_worker = hasattr(config, "workerinput")
    for item in items:
        name = getattr(item, "originalname", None)
        if name in _STANDALONE and in_worker:
            continue  # the `ddp` launcher re-runs the command line: never from an xdist worker
        if name in _CPU_PORT:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "skipif"]
            _ported.append(item.nodeid)
    state = _shim_state()
    if _MODE == "shim":
        import toggleshim

        if state != "patched" or not toggleshim.is_installed():
            pytest.exit(
                f"toggleshim is not active on {_FLAVOUR}.LightningModule ({state}, "
                f"is_installed()={toggleshim.is_installed()})",
                returncode=3,
            )
    elif state != "original" or "toggleshim" in sys.modules:
        pytest.exit(f"baseline run, but toggleshim is imported or {_FLAVOUR} is {state}", returncode=3)


@pytest.fixture(autouse=True)
def _toggleshim_suite_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    if request.node.nodeid in _ported:
        trainer_cls = importlib.import_module(_FLAVOUR).Trainer
        original_init = trainer_cls.__init__

        def cpu_init(self: Any, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("accelerator") in ("gpu", "cuda"):
                kwargs["accelerator"] = "cpu"
            if kwargs.get("precision") in ("16-mixed", 16, "16"):
                kwargs["precision"] = "bf16-mixed"
            original_init(self, *args, **kwargs)

        monkeypatch.setattr(trainer_cls, "__init__", cpu_init)
    expected = "patched" if _MODE == "shim" else "original"
    before = _shim_state()
    yield
    after = _shim_state()
    if before != expected or after != expected:
        _problems.append(f"{request.node.nodeid}: toggle_optimizer was {before} before, {after} after")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    start = _toggles[0]
    try:
        return (yield)
    finally:
        _per_test[item.nodeid] = _per_test.get(item.nodeid, 0) + _toggles[0] - start


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    current = _outcomes.get(report.nodeid)
    if report.when == "call":
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        _outcomes[report.nodeid] = "error" if current == "error" else outcome
    elif report.failed:
        _outcomes[report.nodeid] = "error"
    elif report.skipped and report.when == "setup":
        _outcomes[report.nodeid] = "skipped"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _OUT:
        return
    record = {
        "pid": os.getpid(),
        "worker": hasattr(session.config, "workerinput"),
        "exitstatus": int(exitstatus),
        "mode": _MODE,
        "flavour": _FLAVOUR,
        "toggleshim_imported": "toggleshim" in sys.modules,
        "toggles": _toggles[0],
        "per_test_toggles": _per_test,
        "outcomes": _outcomes,
        "problems": _problems,
        "cpu_ported": _ported,
    }
    path = Path(_OUT) / f"proc-{os.getpid()}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=True))
