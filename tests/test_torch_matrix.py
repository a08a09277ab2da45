"""scripts/torch_matrix.py: its cells are what the Lightning releases' metadata says, and a cell's records
(meta.json, junit.xml, check.json) become the row the docs render, failing tests named.

The metadata itself is read from the registry by ``python3 scripts/torch_matrix.py derive`` (not here:
the suite runs offline); here the cells are re-derived from the requirements the script records, and
those are held to the torch floors tests/test_workflow.py records for the GitHub matrix."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from test_workflow import LIGHTNING_TORCH_FLOOR, LIGHTNING_VERSIONS, TOGGLESHIM_TORCH_FLOOR, _v

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import docs_numbers
    import torch_matrix
finally:
    sys.path.pop(0)


def test_the_releases_are_the_matrix_and_their_torch_floors_the_workflows() -> None:
    assert torch_matrix.LIGHTNING_VERSIONS == LIGHTNING_VERSIONS
    assert list(torch_matrix.TORCH_REQUIREMENTS) == LIGHTNING_VERSIONS
    for release, specs in torch_matrix.TORCH_REQUIREMENTS.items():
        for spec in specs.values():
            assert f">={LIGHTNING_TORCH_FLOOR[release]}" in spec.split(","), (release, spec)


def test_each_torchs_lightning_range_is_derived_from_the_requirements() -> None:
    for torch in torch_matrix.TORCH_VERSIONS:
        assert torch_matrix.LIGHTNING_RANGE[torch] == torch_matrix.accepting_range(
            torch, torch_matrix.TORCH_REQUIREMENTS
        )
    # the control: a release that refused torch 2.0 would move the floor's newest Lightning
    narrowed = {**torch_matrix.TORCH_REQUIREMENTS, "2.3.3": {"lightning": ">=2.1.0", "pytorch-lightning": ">=2.1.0"}}
    assert torch_matrix.accepting_range("2.0.1", narrowed) == ("2.0.9.post0", "2.2.5")
    assert torch_matrix.accepting_range("1.0.0", narrowed) is None


def test_the_cells_are_every_torch_with_its_oldest_and_newest_lightning_the_floor_first() -> None:
    cells = torch_matrix.cells()
    assert len(cells) == len(set(cells))
    assert set(cells) == {(t, v) for t, pair in torch_matrix.LIGHTNING_RANGE.items() for v in pair}
    assert cells[0] == ("2.0.1", "2.0.9.post0")
    assert {t for t, _ in cells} == set(torch_matrix.TORCH_VERSIONS)
    # the claimed floor (pyproject's torch>=2.0.1) is the first torch, and no torch is run twice in a line
    assert _v(torch_matrix.TORCH_VERSIONS[0]) == _v(TOGGLESHIM_TORCH_FLOOR)
    assert sorted(torch_matrix.TORCH_VERSIONS, key=_v) == torch_matrix.TORCH_VERSIONS
    assert len({_v(t)[:2] for t in torch_matrix.TORCH_VERSIONS}) == len(torch_matrix.TORCH_VERSIONS)


def _cell(tmp_path: Path, **meta: Any) -> Path:
    out = tmp_path / torch_matrix.slug("2.1.2", "2.6.6")
    out.mkdir()
    base = {"torch_requested": "2.1.2", "lightning_requested": "2.6.6", "python": "3.11.7", "commit": "abc1234",
            "versions": {"torch": "2.1.2", "lightning": "2.6.6", "pytorch-lightning": "2.6.6"},
            "import_errors": {"lightning.pytorch": None, "pytorch_lightning": None},
            "recorded_at": "2026-12-07T05:00:00+00:00", "seconds": {"total": 600}}  # fmt: skip
    (out / "meta.json").write_text(json.dumps({**base, **meta}))
    return out


JUNIT = """<?xml version="1.0"?><testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" time="9">
<testcase classname="tests.test_shim" name="test_ok"/>
<testcase classname="tests.test_shim" name="test_bad[x]"><failure message="AssertionError: boom">def f():
E   AssertionError: boom
E   assert 1 == 2</failure></testcase>
<testcase classname="tests.test_shim" name="test_skip"><skipped message="no"/></testcase>
</testsuite></testsuites>"""


def test_a_failing_cell_is_a_fail_row_with_its_failing_test_named(tmp_path: Path) -> None:
    out = _cell(tmp_path, pytest_exit=1, check_exit=0)
    (out / "junit.xml").write_text(JUNIT)
    (out / "check.json").write_text(
        json.dumps(
            {
                "ok": True,
                "properties": [{"prop": "nesting", "flavour": f, "verdict": "pass", "examples": 3} for f in ("a", "b")],
            }
        )
    )
    row = torch_matrix._row(out)
    assert (row["tests"], row["result"], row["check"]) == ("1 / 1 / 0 / 1", "FAIL", "ok (2/2 properties)")
    assert (row["torch"], row["lightning"], row["commit"], row["minutes"]) == ("2.1.2", "2.6.6", "abc1234", 10.0)
    assert row["check_properties"] == ["nesting"]
    found = torch_matrix.failures(out / "junit.xml")
    assert len(found) == 1 and found[0].startswith("FAILURE tests/test_shim.py::test_bad[x]")
    assert "E   assert 1 == 2" in found[0]
    # the control: the same cell with every test passing is a pass
    (out / "junit.xml").write_text(JUNIT.replace('failures="1"', 'failures="0"'))
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "pytest_exit": 0}))
    assert torch_matrix._row(out)["result"] == "pass"


def test_checks_torch_properties_are_in_the_row_a_failing_one_by_name(tmp_path: Path) -> None:
    out = _cell(tmp_path, pytest_exit=0, check_exit=1)
    (out / "junit.xml").write_text(JUNIT.replace('failures="1"', 'failures="0"'))
    torch = [
        {"prop": "step refused", "flavour": "a", "verdict": "pass"},
        {"prop": "step refused after compile", "flavour": "a", "verdict": "FAIL"},
        {"prop": "compile keeps dynamo out", "flavour": "a", "verdict": "n/a"},
    ]
    (out / "check.json").write_text(json.dumps({"ok": False, "properties": [], "torch": torch}))
    row = torch_matrix._row(out)
    assert row["result"] == "FAIL"
    assert row["check"].endswith("; torch properties: 1 pass, 1 FAIL, 1 n/a (step refused after compile)")


def test_a_cell_that_did_not_install_is_recorded_so(tmp_path: Path) -> None:
    out = _cell(tmp_path, install_failed="lightning (exit 1)", versions={})
    row = torch_matrix._row(out)
    assert row["result"] == "install failed: lightning (exit 1)" and row["tests"] == "not run"
    assert row["torch"] == "2.1.2"


def test_the_docs_table_names_the_cells_not_run_and_the_pythons_not_verified_here() -> None:
    data = json.loads(docs_numbers.DATA.read_text())
    data["measured"]["matrix"] = {"produced_by": "`x`", "generated": "now", "rows": [
        {"torch": "2.1.2", "lightning": "2.6.6", "python": "3.11.7", "tests": "1 / 0 / 0 / 0", "check": "ok",
         "check_properties": sorted(p[0] for p in data["inputs"]["check"]["properties"]), "result": "pass",
         "commit": "abc1234", "date": "2026-12-07 05:00", "minutes": 10.0},
        {"torch": "2.0.1", "lightning": "2.0.9.post0", "python": "", "tests": "", "check": "",
         "check_properties": [], "result": "not run", "commit": "", "date": "", "minutes": 0}]}  # fmt: skip
    text = docs_numbers.render_matrix(data)
    assert "Run here on Python 3.11.7 only, 1 of the 2 cells" in text
    assert "| 2.0.1 | 2.0.9.post0 |  |  | not run |  |" in text
    others = [py for py in data["inputs"]["ci"]["pythons"] if py != "3.11"]
    assert f"Python {', '.join(others)}: only in the GitHub workflow" in text
    assert "predate" not in text
    rows = data["measured"]["matrix"]["rows"]
    rows[1] = {**rows[0], "torch": "2.0.1", "lightning": "2.0.9.post0"}  # every cell ran
    assert "Run here on Python 3.11.7 only, all 2 cells, by `x`" in docs_numbers.render_matrix(data)


@pytest.mark.parametrize("command", [["cells"]])
def test_it_runs_as_a_command(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert torch_matrix.main(command) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("2.0.1 2.0.9.post0")


def test_table_keeps_the_recorded_row_of_a_cell_not_run_now(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    results.mkdir()
    out = _cell(results, pytest_exit=0, check_exit=0)  # 2.1.2:2.6.6 run now, at abc1234
    (out / "junit.xml").write_text(JUNIT.replace('failures="1"', 'failures="0"'))

    def recorded(torch: str, lightning: str, result: str, commit: str) -> dict[str, Any]:
        return {"torch": torch, "lightning": lightning, "python": "3.11.7", "tests": "1 / 0 / 0 / 0", "check": "ok",
                "check_properties": [], "result": result, "commit": commit, "date": "2026-12-07 05:00",
                "minutes": 9.0}  # fmt: skip

    earlier = [
        recorded("2.0.1", "2.0.9.post0", "pass", "d73c9ab"),  # not run now: kept
        recorded("2.1.2", "2.6.6", "pass", "10c7215"),  # run now: replaced
        recorded("2.13.0+cpu", "2.6.6", "FAIL", "1111111"),  # a local version still names its cell
        {**recorded("2.3.1", "2.6.6", "not run", ""), "python": ""},
        recorded("1.13.1", "2.0.9.post0", "pass", "2222222"),  # no longer a cell: dropped
    ]
    data = tmp_path / "numbers.json"
    data.write_text(json.dumps({"other": 1, "measured": {"matrix": {"rows": earlier}, "kept": True}}))
    assert torch_matrix.main(["table", "--results", str(results), "--data", str(data)]) == 0
    capsys.readouterr()
    written = json.loads(data.read_text())
    assert written["other"] == 1 and written["measured"]["kept"] is True
    rows = {(r["torch"].split("+")[0], r["lightning"]): r for r in written["measured"]["matrix"]["rows"]}
    assert set(rows) == set(torch_matrix.cells())
    assert rows[("2.0.1", "2.0.9.post0")] == earlier[0]
    assert (rows[("2.1.2", "2.6.6")]["commit"], rows[("2.1.2", "2.6.6")]["result"]) == ("abc1234", "pass")
    assert rows[("2.13.0", "2.6.6")] == earlier[2]
    # the control: a cell neither run now nor recorded before (or recorded as not run) is "not run"
    assert rows[("2.3.1", "2.6.6")]["result"] == "not run"
    assert rows[("2.14.1", "2.0.9.post0")]["result"] == "not run" and rows[("2.14.1", "2.0.9.post0")]["commit"] == ""
    # without a data file, nothing earlier is kept
    assert torch_matrix.recorded_rows(tmp_path / "missing.json") == {}
