"""The distributions as a release would publish them: ``python -m build`` (``twine check --strict`` runs
in the release workflow), then what the wheel and the sdist hold; and the ``test`` extra.

The build runs once per session (shared by the xdist workers through a lock), from a copy of the
source tree so that nothing is written into the checkout, and in build's isolated environment, which
has setuptools but no torch or Lightning: it succeeding shows the version is read from
``toggleshim/__init__.py`` without importing the package. The wheel must hold the package,
``py.typed`` and the license and nothing else; the sdist must also hold the test suite, which must
collect from the unpacked sdist (distribution packagers run it from there).
"""

from __future__ import annotations

import ast
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock  # a dependency of torch

import toggleshim

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
VERSION = toggleshim.__version__
# What never belongs in a wheel: the repository's other top-level folders.
NOT_IN_WHEEL = (
    "tests/", "property_tests/", "benchmarks/", "scripts/", "examples/", "docs/", "constraints/", ".github/",
)  # fmt: skip
# Left out of the copy the build starts from: caches and earlier builds, never sources.
COPY_IGNORE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".nox", ".venv", "venv", ".hypothesis",
    ".mypy_cache", ".ruff_cache", ".pytest_cache", "lightning_logs",
)  # fmt: skip


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``python -m build`` (sdist, then the wheel from the sdist) of a copy of the source tree."""
    base = tmp_path_factory.getbasetemp()
    # one directory for all xdist workers (theirs are popen-gwN in the session's); alone, the session's
    shared = base.parent if base.name.startswith("popen-gw") else base
    out, done = shared / "toggleshim-dists", shared / "toggleshim-dists.json"
    with FileLock(str(shared / "toggleshim-dists.lock")):
        if not done.exists():
            src = shared / "toggleshim-src"
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(ROOT, src, ignore=COPY_IGNORE)
            _run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], cwd=shared)
            sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
            assert len(sdists) == len(wheels) == 1, sorted(p.name for p in out.iterdir())
            done.write_text(json.dumps({"sdist": str(sdists[0]), "wheel": str(wheels[0])}))
    return {kind: Path(path) for kind, path in json.loads(done.read_text()).items()}


def _metadata(text: str) -> email.message.Message:
    return email.parser.HeaderParser().parsestr(text)


def _source_files(folder: str) -> set[str]:
    """The files under ``folder`` of the source tree, as paths relative to the root (no caches)."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so")
    }


# the version


def test_version_is_a_literal_setuptools_reads_without_importing() -> None:
    """``[tool.setuptools.dynamic] version = {attr = "toggleshim.__version__"}`` reads the value from
    the file when it is a plain string literal, and imports the package (torch, Lightning) when not."""
    tree = ast.parse((ROOT / "toggleshim" / "__init__.py").read_text())
    values = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
    ]
    assert len(values) == 1 and isinstance(values[0], ast.Constant) and values[0].value == VERSION
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'version = {attr = "toggleshim.__version__"}' in pyproject


# the wheel


def test_wheel_is_pure_python_and_the_release_job_runs_twine_check_strict(dists: dict[str, Path]) -> None:
    """The names of both distributions; ``twine check --strict`` runs where a release is built (the
    release workflow, on the very files it uploads), not in the suite: twine and its keyring
    (cryptography, ...) are release tools, kept out of the ``test`` extra (issue 44)."""
    assert dists["wheel"].name == f"toggleshim-{VERSION}-py3-none-any.whl"
    assert dists["sdist"].name == f"toggleshim-{VERSION}.tar.gz"
    release = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert "run: python -m twine check --strict dist/*" in release


def test_wheel_holds_the_package_typed_marker_and_license_only(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as zf:
        names = set(zf.namelist())
        info = f"toggleshim-{VERSION}.dist-info/"
        metadata = _metadata(zf.read(info + "METADATA").decode())
        wheel = _metadata(zf.read(info + "WHEEL").decode())
        license_text = zf.read(info + "licenses/LICENSE")
        entry_points = zf.read(info + "entry_points.txt").decode()
    package = {n for n in names if not n.startswith(info)}
    expected = {f for f in _source_files("toggleshim") if f.endswith((".py", "py.typed"))}
    expected.add("toggleshim_pytest.py")  # the pytest plugin: top level, so loading it imports no torch
    expected.add("toggleshim_trainer.py")  # the Trainer's callbacks factory: top level, for the same reason
    assert package == expected, f"extra: {package - expected}, missing: {expected - package}"
    assert "toggleshim/py.typed" in package
    assert not [n for n in names if n.startswith(NOT_IN_WHEEL) or n.endswith((".so", ".c", ".pyd"))]
    # the license: shipped under dist-info/licenses and named in the metadata (PEP 639)
    assert license_text == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in license_text and b"Version 2.0, January 2004" in license_text
    assert b"END OF TERMS AND CONDITIONS" in license_text
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert not [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    assert (metadata["Name"], metadata["Version"]) == ("toggleshim", VERSION)
    assert tuple(map(int, metadata["Metadata-Version"].split("."))) >= (2, 4)
    assert metadata["Requires-Python"] == ">=3.10"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    assert (wheel["Root-Is-Purelib"], wheel["Tag"]) == ("true", "py3-none-any")
    assert "toggleshim = toggleshim.__main__:main" in entry_points


# the sdist


def test_sdist_holds_the_sources_and_the_whole_test_suite(dists: dict[str, Path]) -> None:
    top = f"toggleshim-{VERSION}/"
    with tarfile.open(dists["sdist"]) as tf:
        names = {m.name[len(top) :] for m in tf.getmembers() if m.isfile()}
        pkg_info = tf.extractfile(top + "PKG-INFO")
        assert pkg_info is not None
        metadata = _metadata(pkg_info.read().decode())
    assert (metadata["Name"], metadata["Version"]) == ("toggleshim", VERSION)
    assert metadata["License-Expression"] == "Apache-2.0"
    required = {"LICENSE", "pyproject.toml", "README.md", "CHANGELOG.md", "conftest.py", "MANIFEST.in", "PKG-INFO"}
    assert required <= names, required - names
    for folder in ("toggleshim", "tests", "property_tests", "examples", "scripts", "constraints", ".github"):
        wanted = _source_files(folder)
        assert wanted and wanted <= names, f"{folder}: missing {sorted(wanted - names)}"
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so"))]


def test_sdist_test_suite_collects_from_the_unpacked_sdist(
    dists: dict[str, Path], tmp_path: Path
) -> None:
    """What a distribution packager does: unpack, run pytest there (here: collect only, the whole
    suite, with the unpacked tree's own pyproject.toml and conftest.py)."""
    with tarfile.open(dists["sdist"]) as tf:
        tf.extractall(tmp_path, filter="data")
    unpacked = tmp_path / f"toggleshim-{VERSION}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-c", str(unpacked / "pyproject.toml"), "--rootdir", str(unpacked),
         "-o", "addopts=", "--import-mode=prepend",
         "-W", "ignore::DeprecationWarning"],
        cwd=unpacked, capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    for folder in ("tests", "property_tests", "examples"):
        files = {f for f in _source_files(folder) if Path(f).name.startswith("test_") and f.endswith(".py")}
        files = {f for f in files if "/typing/" not in f}
        missing = [f for f in files if not any(line.startswith(f + "::") for line in collected)]
        assert not missing, f"collected nothing from {missing}"


# the release gate


def test_release_check_accepts_the_matching_tag_and_names_each_mismatch(dists: dict[str, Path]) -> None:
    script = [sys.executable, str(SCRIPTS / "release_check.py")]
    dist = dists["wheel"].parent
    ok = subprocess.run([*script, "--tag", f"v{VERSION}", str(dist)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"v{VERSION} matches toggleshim {VERSION}" in ok.stdout
    wrong = subprocess.run([*script, "--tag", "v99.0.0", str(dist)], capture_output=True, text=True, check=False)
    assert wrong.returncode == 1 and wrong.stdout == ""
    for expected in ("__version__", "sdist", "wheel", "CHANGELOG.md has no section '## [99.0.0]"):
        assert expected in wrong.stderr, wrong.stderr
    bad = subprocess.run([*script, "--tag", "0.1.0", str(dist)], capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "is not v<version>" in bad.stderr


# type checkers find the package as a user installs it: from a checkout (editable) or the wheel

_USER_FILE = """\
from toggleshim import Toggle, toggle

def use(t: Toggle[list[int]]) -> None:
    reveal_type(toggle)
"""


def _mypy_in(env: Path | None, user: Path) -> str:
    """``mypy --strict`` on a user file outside the checkout, against the packages of venv ``env``
    (torch and Lightning absent there: only toggleshim's own resolution is under test)."""
    python = env / "bin" / "python" if env is not None else Path(sys.executable)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable", str(python),
         "--config-file", os.devnull, str(user)],
        cwd=user.parent, capture_output=True, text=True, timeout=300, check=False,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")},  # the venv's own paths only
    )
    return proc.stdout + proc.stderr


def test_type_checkers_find_the_package_after_an_editable_or_a_wheel_install(
    dists: dict[str, Path], tmp_path: Path
) -> None:
    user = tmp_path / "project" / "train.py"
    user.parent.mkdir()
    user.write_text(_USER_FILE)
    envs = {}
    for kind in ("bare", "editable", "wheel"):  # without pip of their own: this pip installs into them
        envs[kind] = tmp_path / kind
        _run([sys.executable, "-m", "venv", "--without-pip", str(envs[kind])], cwd=tmp_path)
    src = dists["sdist"].parent.parent / "toggleshim-src"  # the copy the build started from
    for kind, what in (("editable", ["-e", str(src)]), ("wheel", [str(dists["wheel"])])):
        python = str(envs[kind] / "bin" / "python")
        _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", *what], cwd=tmp_path)
    # the control: where toggleshim is not installed, mypy says so (this check can fail)
    assert 'module named "toggleshim"' in _mypy_in(envs["bare"], user)
    for kind in ("editable", "wheel"):
        out = _mypy_in(envs[kind], user)
        assert "import-not-found" not in out and "error:" not in out, (kind, out)
        assert "toggleshim._block.Toggle[" in out, (kind, out)  # the real signature, not Any


# the test extra: what the README's `pip install -e ".[test,lightning]"` installs for the suite

# the distribution of each module the suite imports or runs (`python -m X`) beyond the standard library,
# toggleshim, torch (numpy, filelock: its dependencies) and Lightning
_SUITE_NEEDS = {"pytest": "pytest", "xdist": "pytest-xdist", "hypothesis": "hypothesis", "libcst": "libcst",
                "yaml": "pyyaml", "check_jsonschema": "check-jsonschema", "matplotlib": "matplotlib", "mypy": "mypy",
                "ruff": "ruff", "build": "build", "typeguard": "typeguard", "beartype": "beartype"}


def _extra(name: str) -> set[str]:
    pyproject = (ROOT / "pyproject.toml").read_text()
    found = re.search(rf"^{name} = \[(.*?)\]\n", pyproject, re.MULTILINE | re.DOTALL)
    assert found is not None, name
    return {re.split(r"[<>=!~\[ ]", req)[0].lower() for req in re.findall(r'"([^"]+)"', found.group(1))}


def test_the_test_extra_holds_what_the_suite_runs_and_no_release_tool() -> None:
    """Every distribution the suite needs is in ``test`` (and in ``dev``, which keeps every tool); twine,
    nox and zizmor (releases, the matrix, the workflow audit: ``.ci/run``) are not (issue 44)."""
    folders = ("tests", "property_tests", "examples")
    suite = "\n".join(p.read_text() for d in folders for p in sorted((ROOT / d).rglob("*.py")))
    for module in _SUITE_NEEDS:  # a tool no test imports or runs any more goes from the list
        used = rf'^\s*(import|from) {module}\b|"-m", "{module}"|^\s*{module}\.'
        # (xdist: `pytest -n auto`; libcst: `toggleshim migrate`, which the migrate tests run)
        assert re.search(used, suite, re.MULTILINE) or module in ("xdist", "libcst"), module
    assert set(_SUITE_NEEDS.values()) <= _extra("test"), set(_SUITE_NEEDS.values()) - _extra("test")
    assert not {"twine", "nox", "zizmor"} & _extra("test")
    assert _extra("test") <= _extra("dev"), _extra("test") - _extra("dev")
