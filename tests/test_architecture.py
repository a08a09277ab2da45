"""docs/architecture.md stays true: every module and name of the package it names exists, and it names
every module of the package (tests/_doc_names.py says how a backticked span is read)."""

from __future__ import annotations

from _doc_names import ROOT, modules, named_modules, problems

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_architecture_names_only_what_exists() -> None:
    found = problems(ARCHITECTURE.read_text())
    assert found == [], "docs/architecture.md names what the tree does not have:\n" + "\n".join(found)


def test_architecture_names_every_module_of_the_package() -> None:
    missing = sorted(set(modules()) - named_modules(ARCHITECTURE.read_text()))
    assert missing == [], "docs/architecture.md does not name these modules of the package: " + ", ".join(missing)


# the reader: each kind of span is resolved, and what does not exist is found


def test_the_reader_resolves_the_packages_names_and_finds_stale_ones() -> None:
    good = ("`_toggle.toggle` `Toggle._exit` `_patch._classify` `harness._Runner.run` `_Made.enterable` "
            "`toggleshim.testing.harness.ManualDriver.block` `__main__.PROPERTIES` `_Plan` `_flags_of` "
            "`testing/harness.py` `_writes.py` "
            "`tests/test_robustness.py::test_ctrl_c_at_every_line_leaves_nothing_behind` "
            "`tests/test_spawn_amp.py::test_spawn_import_*` `self.opt` `torch.compile` `setup.py` `src/gan.py`")
    assert problems(good) == []
    stale = ("`_toggle._keep_dynamo_out` `Toggle._nope(x)` `_Gone.undo` `_migrate.py` `_nowhere` "
             "`tests/test_shim.py::test_no_such_test` `scripts/nothing.py`")
    assert len(problems(stale)) == 7, problems(stale)


def test_the_reader_knows_every_way_a_module_is_named() -> None:
    text = "`_toggle.py`, `testing/harness.py`, `specs`, `_migrate/`, `toggleshim._migrate._rules`, `__main__.py`"
    assert named_modules(text) == {"toggleshim._toggle", "toggleshim.testing.harness", "toggleshim.testing.specs",
                                   "toggleshim._migrate", "toggleshim._migrate._rules", "toggleshim.__main__"}
    assert len(modules()) > 30 and "toggleshim.testing._worlds" in modules()
