"""Hypothesis profiles (chosen by ``HYPOTHESIS_PROFILE``) and the Lightning flavours under test.

Profiles: ``dev`` (fast, the default), ``ci`` (what ``.ci/run`` uses: derandomized, so a CI failure
reproduces), ``deep`` (10x ``ci``), ``debug`` (verbose, few examples). ``deadline=None`` everywhere:
torch's first calls are slow. ``TOGGLESHIM_FLAVOUR`` restricts the flavours (the CI matrix sets it).
"""

from __future__ import annotations

import importlib
import os

import pytest
from hypothesis import HealthCheck, Phase, Verbosity, settings

_common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=20, **_common)
settings.register_profile("ci", max_examples=100, derandomize=True, database=None, **_common)
settings.register_profile("deep", max_examples=1000, **_common)
settings.register_profile(
    "debug", max_examples=10, verbosity=Verbosity.verbose,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink], **_common
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _flavours() -> list[str]:
    wanted = os.environ.get("TOGGLESHIM_FLAVOUR", "")
    names = [f.strip() for f in wanted.split(",") if f.strip()] or ["lightning.pytorch", "pytorch_lightning"]
    found = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            if wanted:  # asked for explicitly: its absence is an error, not a skip
                raise
            continue
        found.append(name)
    if not found:
        raise RuntimeError("no Lightning flavour is installed: pip install lightning")
    return found


FLAVOURS = _flavours()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``flavour`` argument runs the test once per installed Lightning flavour (a plain parameter,
    not a fixture, so Hypothesis tests may take it)."""
    if "flavour" in metafunc.fixturenames:
        metafunc.parametrize("flavour", FLAVOURS)
