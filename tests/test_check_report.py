"""``toggleshim check``'s failure report as users read it (issue 36, points 2 and 3).

A Lightning whose ``untoggle_optimizer`` does nothing (a copy of the installed one, edited, first on
``PYTHONPATH``: ``python -m toggleshim check`` runs exactly as a user runs it) fails every property
in both flavours; the report fits a screen (at most ``MAX_LINES`` lines, none over 1,000 characters),
piped and on a terminal, with the smallest failing world first; ``--json`` keeps every counterexample
and difference. Every snippet it prints runs in a fresh interpreter with the imports it prints and
reproduces its failure; every hand-picked world of every property, and drawn ones, render as snippets
that rebuild exactly that world and run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _fake_release import UNTOGGLE_NOTHING, release_tree, user_env
from _terminal import run_on_pty
from hypothesis import HealthCheck, given, settings

import toggleshim.testing
from toggleshim.__main__ import MAX_LINES, PROPERTIES
from toggleshim.testing import FLAT_EXAMPLES, installed_flavours, specs
from toggleshim.testing.report import MAX_LINE, WIDTH, Failure, failure_report, render, snippet, world_size

CHECK = [sys.executable, "-m", "toggleshim", "check"]


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Lightning 2.7.0 whose untoggle_optimizer does nothing, in every installed flavour."""
    dest = tmp_path_factory.mktemp("lightning-2.7.0")
    for flavour in installed_flavours():
        release_tree(dest, flavour, (UNTOGGLE_NOTHING,), "2.7.0")
    return dest


@pytest.fixture(scope="module")
def failing_check(broken: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """``python -m toggleshim check --json report.json`` on it, piped: (what it printed, the JSON)."""
    work = tmp_path_factory.mktemp("project")
    proc = subprocess.run([*CHECK, "--json", "report.json"], cwd=work, env=user_env(broken), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # the gate's import warning is the report's business here (Lightning's own warnings may be there:
    # an old Lightning's fabric warns about pkg_resources)
    assert "toggleshim" not in proc.stderr.lower() and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout, json.loads((work / "report.json").read_text())


def screen_lines(text: str) -> list[str]:
    """What stays on a terminal: each line as last drawn (the progress bar is redrawn in place)."""
    return [line.rsplit("\x1b[2K", 1)[-1].rstrip("\r") for line in text.replace("\r\n", "\n").split("\n")]


# the report fits a screen, smallest world first; the JSON keeps everything


def test_a_check_failing_everywhere_fits_a_screen(failing_check: tuple[str, dict[str, Any]]) -> None:
    out, report = failing_check
    lines = out.rstrip("\n").split("\n")
    assert len(lines) <= MAX_LINES and max(map(len, lines)) <= MAX_LINE, (len(lines), max(map(len, lines)))
    failed = [(p["flavour"], p["prop"]) for p in report["properties"] if p["verdict"] == "FAIL"]
    assert len(failed) == len(PROPERTIES) * len(installed_flavours())  # every property, every flavour
    for flavour, prop in failed:  # each one named in the text: shown whole, or one line each after the first
        assert re.search(rf"^(MISMATCH in |  ){re.escape(flavour)}|the same in {re.escape(flavour)}\)", out, re.M)
        assert re.search(rf"{re.escape(flavour)}[^\n]* / {re.escape(prop)}[ :\[]", out), (flavour, prop)
    assert out.count("Reproduce with:") >= 1 and "Also failing" in out
    # the first counterexample shown is the smallest world that fails
    first = out.split("MISMATCH in ", 1)[1].split(":", 1)[0]
    shown = first.split(" / ")[1].split(" [")[0]
    sizes = {p["prop"]: p["size"] for p in report["properties"] if p["verdict"] == "FAIL"}
    assert sizes[shown] == min(sizes.values()), (shown, sizes)
    # and unverified code gets its way forward, each choice with its command
    assert "Your choices:" in out and "pip install --upgrade toggleshim" in out
    assert "certify" not in out.split("Your choices:", 1)[1]  # no certificate while a property fails
    # the torch properties ran that Lightning too, and failed (nothing untoggles), each named
    torch_failed = [(t["flavour"], t["prop"]) for t in report["torch"] if t["verdict"] == "FAIL"]
    assert torch_failed
    for flavour, prop in torch_failed:
        assert re.search(rf"{re.escape(flavour)}[^\n]* {re.escape(prop)} +FAIL", out), (flavour, prop)
    examples = sum(p["examples"] for p in report["properties"])
    unable = sum(t["verdict"] == "n/a" for t in report["torch"])  # (torch.compile refusing this Python)
    assert out.rstrip().endswith(f"{len(failed) + len(torch_failed)} failed{f', {unable} n/a' if unable else ''}, "
                                 f"{examples} examples in {report['seconds']:.1f} s")


def test_the_json_keeps_every_counterexample_and_difference(failing_check: tuple[str, dict[str, Any]]) -> None:
    report = failing_check[1]
    for p in report["properties"]:
        assert p["snippet"] and p["world"] and p["size"] and p["origin"], p
        assert p["world"] in p["snippet"]
    # a list of differing parameters: every one in the JSON, in the text a count and three beyond three
    listed = [p for p in report["properties"] if p["details"]]
    assert listed
    for p in listed:
        shown = p["details"] if len(p["details"]) <= 3 else p["details"][:3]
        assert "; ".join(shown) in p["message"], p


def test_the_report_fits_a_screen_on_a_terminal(broken: Path, tmp_path: Path) -> None:
    rc, out = run_on_pty([*CHECK, "--examples", "20"], cwd=tmp_path, env=user_env(broken))
    assert rc == 1, out
    # the report is everything from its header on; above it only Lightning's own import warnings, if any
    # (an old Lightning's fabric warns about pkg_resources on the same terminal)
    screen = screen_lines(out)
    start = next(i for i, line in enumerate(screen) if line.startswith("toggleshim check: toggleshim "))
    assert all("toggleshim" not in line.lower() for line in screen[:start]), screen[:start]
    assert all(re.search(r"Warning: |^  ", line) for line in screen[:start:2]), screen[:start]
    report = screen[start:]
    lines = [line for line in report if line]
    assert len(report) <= MAX_LINES + 1, len(report)  # (the last line is the cursor's)
    assert max(map(len, lines)) <= MAX_LINE
    assert "Reproduce with:" in out and "Also failing" in out and "FAILED:" in lines[-1]


def test_hundreds_of_differing_parameters_read_as_a_count_and_three(broken: Path) -> None:
    """The hand-picked world of 304 parameters on that Lightning: 260-odd parameters differ."""
    code = (
        "from toggleshim.testing import FLAT_EXAMPLES, Mismatch, assert_lightning_follows_model\n"
        "from toggleshim.testing.report import world_size\n"
        "import json\n"
        "largest = max(FLAT_EXAMPLES, key=world_size)  # the one of 304 parameters\n"
        "try:\n"
        "    assert_lightning_follows_model(largest, 'lightning.pytorch')\n"
        "except Mismatch as exc:\n"
        "    print(json.dumps([str(exc), exc.details]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=user_env(broken), capture_output=True, text=True,
                          timeout=300)
    message, details = json.loads(proc.stdout)
    assert len(details) > 200 and len(message) < 1000, (len(details), message)
    assert f"{len(details)} parameters differ, e.g. {'; '.join(details[:3])}; and {len(details) - 3} more" in message


# every counterexample runs as printed and reproduces its failure

_RUN_ALL = """
import json, sys, traceback
results = []
for code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, "<snippet>", "exec"), {})  # nothing but what the snippet imports
        results.append(None)
    except BaseException as exc:
        results.append([type(exc).__name__, str(exc)])
json.dump(results, open(sys.argv[2], "w"))
"""


def run_snippets(snippets: list[str], tmp_path: Path, env: dict[str, str]) -> list[Any]:
    """Each snippet in a fresh namespace of one fresh interpreter: None, or (exception type, message)."""
    (tmp_path / "snippets.json").write_text(json.dumps(snippets))
    proc = subprocess.run([sys.executable, "-c", _RUN_ALL, "snippets.json", "results.json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return list(json.loads((tmp_path / "results.json").read_text()))


def test_every_counterexample_of_the_failing_check_reproduces_it(
    failing_check: tuple[str, dict[str, Any]], broken: Path, tmp_path: Path
) -> None:
    out, report = failing_check
    failed = [p for p in report["properties"] if p["verdict"] == "FAIL"]
    results = run_snippets([p["snippet"] for p in failed], tmp_path, user_env(broken))
    for p, result in zip(failed, results):
        assert result is not None and result[0] == "Mismatch", (p["prop"], result)
        assert p["message"].split(": ", 1)[1] in result[1], (p["message"], result)
    # the first one, copied from the terminal's text and run as it stands
    printed = out.split("Reproduce with:\n\n", 1)[1].split("\n\n", 1)[0]
    proc = subprocess.run([sys.executable, "-c", printed], env=user_env(broken), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "Mismatch" in proc.stderr, proc.stderr


def _drawn(prop: Any, n: int) -> list[Any]:
    """``n`` worlds the property draws (derandomized: the same every run)."""
    found: list[Any] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(prop.strategy())
    def draw(spec: Any) -> None:
        found.append(spec)

    draw()
    return found[:n]


@pytest.mark.parametrize("prop", PROPERTIES, ids=[p.name for p in PROPERTIES])
def test_every_world_renders_as_the_python_that_builds_it(prop: Any) -> None:
    for spec in [*prop.hand_picked(), *_drawn(prop, 60)]:
        text = snippet(spec, prop.checker, "lightning.pytorch")
        namespace: dict[str, Any] = {}
        imports, rest = text.split("\nspec = ", 1)
        exec(imports, namespace)
        assert eval(rest.rsplit("\n" + prop.checker, 1)[0], namespace) == spec, text
        assert "\n\n" not in text and max(map(len, text.splitlines())) <= MAX_LINE
        assert all(len(line) <= WIDTH for line in render(spec).splitlines() if "'y' * " not in line)


@pytest.mark.one_flavour_by_default
def test_every_hand_picked_and_some_drawn_worlds_run_as_printed(flavour: str, tmp_path: Path) -> None:
    """On the installed Lightning each passes: the imports printed are all a snippet needs."""
    cases = [(p, spec) for p in PROPERTIES for spec in [*p.hand_picked(), *_drawn(p, 3)]]
    results = run_snippets([snippet(spec, p.checker, flavour) for p, spec in cases], tmp_path, user_env())
    assert results == [None] * len(cases), [(p.name, r) for (p, _), r in zip(cases, results) if r is not None]


def test_every_op_a_snippet_can_contain_is_exported() -> None:
    defined = [cls for name, cls in vars(specs).items()
               if isinstance(cls, type) and cls.__module__ == specs.__name__ and hasattr(cls, "__dataclass_fields__")]
    assert {"Untoggle", "BadFlag", "ReplaceRecord", "Overrides"} <= {c.__name__ for c in defined}
    for cls in defined:
        assert getattr(toggleshim.testing, cls.__name__, None) is cls, cls
        assert cls.__name__ in toggleshim.testing.__all__


# the layout, unit by unit


def test_the_layout_keeps_the_budget_however_many_fail() -> None:
    long = snippet(max(FLAT_EXAMPLES, key=world_size), "assert_toggle_equivalent", "lightning.pytorch")
    failures = [Failure(flavour, f"prop{i}", f"message {i}" + " x" * 2000, long, (10 - i, 0, 0, 0), "hand-picked")
                for i in range(7) for flavour in ("lightning.pytorch", "pytorch_lightning")]
    for budget in (10, 40, 100):
        lines = failure_report(failures, budget)
        assert len(lines) <= budget and max(map(len, lines)) <= MAX_LINE
        # the smallest world first, the same failure in both flavours once
        named = [line for line in lines if "/ prop" in line]
        assert len(named) == 7 and "lightning.pytorch (the same in pytorch_lightning) / prop6" in named[0], named
    assert "Reproduce with:" in "\n".join(failure_report(failures, 100))
