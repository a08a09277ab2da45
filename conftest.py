"""Hypothesis profiles (chosen by ``HYPOTHESIS_PROFILE``) and the Lightning flavours under test.

Profiles: ``dev`` (fast, the default), ``ci`` (what ``.ci/run`` uses: derandomized, so a CI failure
reproduces), ``deep`` (2,000 a property, nightly), ``debug`` (verbose, few examples). ``deadline=None`` everywhere:
torch's first calls are slow. ``TOGGLESHIM_FLAVOUR`` restricts the flavours (the CI matrix sets it).
"""

from __future__ import annotations

import os

import pytest
from _fixtures import marked_flavours
from hypothesis import HealthCheck, Phase, Verbosity, settings

from toggleshim.testing import installed_flavours

_common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
# TOGGLESHIM_DERANDOMIZE=1 (.ci/run's oldest-Lightning run): the dev profile draws the same examples
# every run, so that a CI verdict reproduces; without it, each run draws new ones (finding new bugs).
_fixed = {"derandomize": True, "database": None} if os.environ.get("TOGGLESHIM_DERANDOMIZE") == "1" else {}
settings.register_profile("dev", max_examples=20, **_fixed, **_common)
settings.register_profile("ci", max_examples=160, derandomize=True, database=None, **_common)  # >= 5,000 worlds, 2 min
settings.register_profile("deep", max_examples=2000, **_common)  # the nightly run
# scripts/mutation_score.py: the ci examples, no shrinking (a caught mutant needs no minimal example)
settings.register_profile(
    "mutants", max_examples=100, derandomize=True, database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate], **_common
)
settings.register_profile(
    "debug", max_examples=10, verbosity=Verbosity.verbose,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink], **_common
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


if os.environ.get("TOGGLESHIM_MUTANT"):  # scripts/mutation_score.py: plant one bug, expect failures
    from toggleshim.testing.mutants import apply

    apply(os.environ["TOGGLESHIM_MUTANT"])

FLAVOURS = installed_flavours()
if not FLAVOURS:
    raise RuntimeError("no Lightning flavour is installed: pip install lightning")


# The ci, deep and mutants profiles run every test on every flavour; the default run (dev) runs the
# tests marked `one_flavour_by_default` (each fresh processes per flavour, where the flavours differ
# only by name) on the first installed flavour alone, to stay within five minutes.
MARKED_FLAVOURS = marked_flavours()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``flavour`` argument runs the test once per installed Lightning flavour (a plain parameter,
    not a fixture, so Hypothesis tests may take it)."""
    if "flavour" in metafunc.fixturenames:
        one = metafunc.definition.get_closest_marker("one_flavour_by_default") is not None
        metafunc.parametrize("flavour", MARKED_FLAVOURS if one else FLAVOURS)


# The test files whose tests start fresh processes (Python, torch and Lightning: ~6 s each) or DDP
# ranks run first, so that the xdist workers end on short tests instead of one waiting on the other.
_SLOW_FIRST = frozenset({
    "test_lightning_suite.py", "test_spawn_amp.py", "test_migrate_overrides.py", "test_training.py",
    "test_packaging.py", "test_plugin.py", "test_cli.py", "test_import_order.py", "test_gate.py",
    "test_certify.py", "test_check_report.py",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in _SLOW_FIRST)  # stable: the order within stays


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``TOGGLESHIM_WORLDS_FILE``, append how many worlds this process built (benchmarks)."""
    path = os.environ.get("TOGGLESHIM_WORLDS_FILE")
    if path:
        from toggleshim.testing import harness

        with open(path, "a") as fh:
            fh.write(f"{harness.WORLDS_BUILT}\n")
