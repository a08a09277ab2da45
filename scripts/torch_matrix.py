"""The torch x Lightning matrix: every claimed torch, with the oldest and the newest Lightning that accepts it.

    nice -n 10 python3 scripts/torch_matrix.py run [--source CHECKOUT] [--results build/matrix]
                                                   [--torch 2.0.1 ...] [--lightning 2.0.9.post0 ...]
                                                   [--cell 2.1.2:2.6.6 ...] [--keep]
    python3 scripts/torch_matrix.py table [--results build/matrix] [--data docs/docs_numbers.json]
    python3 scripts/torch_matrix.py derive      # re-read the Lightning releases' metadata (pip), compare with CELLS
    python3 scripts/torch_matrix.py cells       # the cells, in the order `run` runs them

``run``, for each cell (one torch, one Lightning release), in order: a fresh venv (``python3 -m venv``);
torch alone first (the registry's default Linux wheel, CUDA libraries included, run on the CPU; pip
honours ``PIP_FIND_LINKS``, e.g. ``PIP_FIND_LINKS="/work/wheelhouse /opt/wheels"`` for a local wheel
dir); then both Lightning distributions at the cell's release (``lightning==V pytorch-lightning==V``,
so the suite and ``check`` test both flavours, ``lightning.pytorch`` and ``pytorch_lightning``) with
constraints/base.txt, constraints/lightning-lt-2.4.txt (``-r`` and ``-c``, Lightning < 2.4) and
constraints/torch-lt-2.4.txt (``-c``, torch < 2.4), torch pinned; then ``-e "CHECKOUT[dev]"``. Then
``python -m toggleshim check --json`` and the whole suite (``pytest -n 2 --junitxml``, with
``HYPOTHESIS_PROFILE=dev`` and ``TOGGLESHIM_DERANDOMIZE=1``) from the checkout. Each cell is recorded in
``RESULTS/<cell>/``: meta.json (the installed versions, torch's included, the checkout's commit, the
exits and times), install.log, check.json and check.log, junit.xml and pytest.log, and failures.txt
(the failing test ids and each one's first error lines) when tests failed. A cell whose install fails
is recorded as such (meta.json says which step; install.log has pip's output). The venv is deleted
after the cell unless ``--keep`` (a CUDA torch venv is about 5 GB).

``--source`` is the toggleshim checkout under test (default: this one): run from a fixed snapshot
(``git worktree add``) so that edits made meanwhile do not change a running cell; the commit recorded
is the snapshot's (``+dirty`` when its package or tests differ from it).

``table`` turns the last run of every cell into ``measured.matrix`` of docs/docs_numbers.json and
renders docs/compatibility.md from it (scripts/docs_numbers.py). A cell with no record under
``--results`` keeps the row the data file already holds for it (an earlier run, its commit and date
included), so that a run of some cells into a fresh results dir does not erase the others; only a cell
neither run now nor recorded before is listed as "not run".

A script and not a nox session: nox's venvs are reused and parametrized by Lightning only, while a
cell here must start from an empty venv, be deleted afterwards (disk), run from another checkout than
the one that holds the tool, and be recorded even when its install fails; the script needs only the
standard library (and pip's own ``packaging`` for ``derive``), so it runs under any Python 3.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent

# The torches the package claims, one of each line the issue names: 2.0.x is the floor (no
# torch.compiler), 2.1.x, 2.3 (2.2-2.4), 2.6 (2.5-2.7: compiler.disable without reason=), 2.8 (the first
# with reason=), 2.13.0 and 2.14.1 (on this machine's disk).
TORCH_VERSIONS = ["2.0.1", "2.1.2", "2.3.1", "2.6.0", "2.8.0", "2.13.0", "2.14.1"]
# The Lightning releases considered: the newest patch of each minor line (noxfile.py's LIGHTNING_VERSIONS;
# never 2.6.2 or 2.6.3, withdrawn).
LIGHTNING_VERSIONS = ["2.0.9.post0", "2.1.4", "2.2.5", "2.3.3", "2.4.0", "2.5.6", "2.6.6"]

# `Requires-Dist: torch` of each release's two distributions, as the registry's metadata says (read by
# `derive`: `pip install --dry-run --no-deps --ignore-installed --report` of `lightning==V
# pytorch-lightning==V`, no wheel downloaded). Both need Python >= 3.8 or later, 3.11 included.
TORCH_REQUIREMENTS = {
    "2.0.9.post0": {"lightning": "<4.0,>=1.11.0", "pytorch-lightning": ">=1.11.0"},
    "2.1.4": {"lightning": "<4.0,>=1.12.0", "pytorch-lightning": ">=1.12.0"},
    "2.2.5": {"lightning": "<4.0,>=1.13.0", "pytorch-lightning": ">=1.13.0"},
    "2.3.3": {"lightning": "<4.0,>=2.0.0", "pytorch-lightning": ">=2.0.0"},
    "2.4.0": {"lightning": "<4.0,>=2.1.0", "pytorch-lightning": ">=2.1.0"},
    "2.5.6": {"lightning": "<4.0,>=2.1.0", "pytorch-lightning": ">=2.1.0"},
    "2.6.6": {"lightning": "<4.0,>=2.1.0", "pytorch-lightning": ">=2.1.0"},
}
# torch -> (the oldest, the newest) Lightning release of LIGHTNING_VERSIONS whose two distributions both
# accept that torch by TORCH_REQUIREMENTS (`accepting_range`; tests/test_torch_matrix.py re-derives it,
# `derive` re-reads the metadata).
LIGHTNING_RANGE = {
    "2.0.1": ("2.0.9.post0", "2.3.3"),
    "2.1.2": ("2.0.9.post0", "2.6.6"),
    "2.3.1": ("2.0.9.post0", "2.6.6"),
    "2.6.0": ("2.0.9.post0", "2.6.6"),
    "2.8.0": ("2.0.9.post0", "2.6.6"),
    "2.13.0": ("2.0.9.post0", "2.6.6"),
    "2.14.1": ("2.0.9.post0", "2.6.6"),
}
# The order `run` takes: the floor and the torches the defects were seen on first, the newest
# Lightning of each torch, then the remaining cells.
FIRST = [
    ("2.0.1", "oldest"), ("2.1.2", "newest"), ("2.1.2", "oldest"), ("2.3.1", "newest"), ("2.6.0", "newest"),
    ("2.8.0", "newest"), ("2.13.0", "newest"), ("2.14.1", "newest"),
]  # fmt: skip

CONSTRAINTS = "constraints"
REPORTED = [
    "torch", "lightning", "pytorch-lightning", "lightning-utilities", "torchmetrics", "numpy", "setuptools",
    "hypothesis", "pytest", "toggleshim",
]  # fmt: skip
MODULES = ["lightning.pytorch", "pytorch_lightning"]


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def cells() -> list[tuple[str, str]]:
    """Every (torch, Lightning) cell, in the order ``run`` takes them."""
    bound = {"oldest": 0, "newest": 1}
    ordered = [(torch, LIGHTNING_RANGE[torch][bound[which]]) for torch, which in FIRST]
    for torch in TORCH_VERSIONS:
        for lightning in dict.fromkeys(LIGHTNING_RANGE[torch]):
            if (torch, lightning) not in ordered:
                ordered.append((torch, lightning))
    return ordered


def slug(torch: str, lightning: str) -> str:
    return f"torch-{torch}_lightning-{lightning}"


# -- which Lightning accepts which torch ---------------------------------------------------------


def _packaging() -> tuple[Any, Any]:
    try:
        specifiers, version = (importlib.import_module(f"packaging.{m}") for m in ("specifiers", "version"))
    except ImportError:  # pip's own copy: the script needs nothing outside the standard library and pip
        specifiers, version = (importlib.import_module(f"pip._vendor.packaging.{m}") for m in ("specifiers", "version"))
    return specifiers.SpecifierSet, version.Version


def accepting_range(torch: str, requirements: dict[str, dict[str, str]]) -> tuple[str, str] | None:
    """(oldest, newest) release of LIGHTNING_VERSIONS whose distributions all accept ``torch``."""
    specifier_set, version = _packaging()
    ok = [v for v in LIGHTNING_VERSIONS if all(version(torch) in specifier_set(spec)
                                               for spec in requirements[v].values())]  # fmt: skip
    return (ok[0], ok[-1]) if ok else None


def read_requirements(python: str = sys.executable) -> dict[str, dict[str, str]]:
    """``Requires-Dist: torch`` of both distributions of every release, from the registry's metadata."""
    found: dict[str, dict[str, str]] = {}
    for release in LIGHTNING_VERSIONS:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            subprocess.run([python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
                            "--report", str(report), f"lightning=={release}", f"pytorch-lightning=={release}"],
                           check=True, stderr=subprocess.DEVNULL)  # fmt: skip
            for item in json.loads(report.read_text())["install"]:
                meta = item["metadata"]
                torch = [d for d in meta.get("requires_dist", []) if re.match(r"torch\s*[<>=!~(]", d) and ";" not in d]
                spec = torch[0][len("torch") :].strip().strip("()").replace(" ", "") if torch else ""
                found.setdefault(release, {})[meta["name"]] = spec
    return found


def derive(args: argparse.Namespace) -> int:
    requirements = read_requirements()
    ranges = {t: accepting_range(t, requirements) for t in TORCH_VERSIONS}
    print("TORCH_REQUIREMENTS = " + json.dumps(requirements, indent=4))
    print("LIGHTNING_RANGE = " + json.dumps(ranges, indent=4))
    differs = [name for name, (got, have) in {"TORCH_REQUIREMENTS": (requirements, TORCH_REQUIREMENTS),
                                              "LIGHTNING_RANGE": (ranges, LIGHTNING_RANGE)}.items()
               if json.loads(json.dumps(got)) != json.loads(json.dumps(have))]  # fmt: skip
    if differs:
        print(f"differs from the script's data: {', '.join(differs)}: copy the above into {__file__}", file=sys.stderr)
        return 1
    print("the script's data is what the metadata says")
    return 0


# -- run -----------------------------------------------------------------------------------------

_PROBE = r"""
import importlib, importlib.metadata as m, json, platform, sys
def version(d):
    try:
        return m.version(d)
    except m.PackageNotFoundError:
        return None
errors = {}
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
        errors[module] = None
    except Exception as exc:
        errors[module] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps({"python": platform.python_version(), "platform": f"{platform.system()} {platform.machine()}",
                  "versions": {d: version(d) for d in json.loads(sys.argv[1])}, "import_errors": errors}))
"""


def _commit(source: Path) -> str | None:
    try:
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--", "toggleshim", "tests",
                                "property_tests", "conftest.py", "pyproject.toml"],
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _step(
    command: list[str],
    log: Path,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> tuple[int, float]:
    """Run ``command``, its output appended to ``log``: (exit code, -1 on a timeout; seconds)."""
    started = time.monotonic()
    with log.open("a") as fh:
        fh.write(f"\n$ {shlex.join(command)}\n")
        fh.flush()
        try:
            code = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                  timeout=timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            fh.write(f"\n[torch_matrix] timed out after {timeout} s\n")
            code = -1
    return code, round(time.monotonic() - started, 1)


def failures(junit: Path, lines: int = 6) -> list[str]:
    """``id`` and the first error lines of every failed or erroring test of a JUnit XML."""
    out: list[str] = []
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return out
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            problem = case.find(kind)
            if problem is None:
                continue
            parts = (case.get("classname") or "").split(".")  # package.module[.Class]: a class is capitalised
            split = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
            module, classes = "/".join(parts[:split]), parts[split:]
            test_id = "::".join([f"{module}.py", *classes, str(case.get("name"))]) if module else str(case.get("name"))
            first = [line for line in (problem.get("message") or "").splitlines() if line.strip()][:1]
            body = [line for line in (problem.text or "").splitlines() if line.strip()]
            error_lines = [line for line in body if line.startswith("E ")][:lines] or body[-lines:]
            out.append(f"{kind.upper()} {test_id}\n" + "\n".join(f"    {line}" for line in [*first, *error_lines]))
    return out


def write_failures(out: Path) -> str | None:
    """``out/failures.txt`` for a cell that did not pass: what failed to install, check's failing properties,
    the failing tests with their first error lines (pytest's last lines where it wrote no JUnit XML)."""
    meta = json.loads((out / "meta.json").read_text())
    parts: list[str] = []
    if meta.get("install_failed"):
        parts.append(f"install failed: {meta['install_failed']}\n{meta.get('install_error', '')}")
    try:
        report = json.loads((out / "check.json").read_text())
    except (OSError, json.JSONDecodeError):
        report = {}
    bad = [
        p for p in [*report.get("properties", []), *report.get("torch", [])] if p.get("verdict") not in ("pass", "n/a")
    ]
    if bad:
        parts.append(
            f"check (exit {meta.get('check_exit')}): {len(bad)} properties failed\n"
            + "\n".join(
                f"    {p.get('flavour')} / {p.get('prop')}: {str(p.get('message', '')).splitlines()[0][:300]}"
                for p in bad
            )
        )
    elif meta.get("check_exit") not in (None, 0):
        log = (out / "check.log").read_text() if (out / "check.log").exists() else ""
        parts.append(f"check exited {meta['check_exit']}:\n" + "\n".join(log.splitlines()[-20:]))
    found = failures(out / "junit.xml")
    if found:
        parts.append(
            f"pytest (exit {meta.get('pytest_exit')}): {len(found)} failed or erroring tests\n\n" + "\n\n".join(found)
        )
    elif meta.get("pytest_exit") not in (None, 0):
        log = (out / "pytest.log").read_text() if (out / "pytest.log").exists() else ""
        parts.append(
            f"pytest exited {meta['pytest_exit']}, no failing test in its JUnit XML; its last lines:\n"
            + "\n".join(log.splitlines()[-25:])
        )
    path = out / "failures.txt"
    if not parts:
        path.unlink(missing_ok=True)
        return None
    path.write_text("\n\n".join(parts) + "\n")
    return str(path)


def _constraint_args(source: Path, torch: str, lightning: str) -> list[str]:
    args = ["-c", str(source / CONSTRAINTS / "base.txt")]
    if _v(lightning) < (2, 4):
        args += ["-r", str(source / CONSTRAINTS / "lightning-lt-2.4.txt"),
                 "-c", str(source / CONSTRAINTS / "lightning-lt-2.4.txt")]  # fmt: skip
    if _v(torch) < (2, 4):
        args += ["-c", str(source / CONSTRAINTS / "torch-lt-2.4.txt")]
    return args


def run_cell(torch: str, lightning: str, args: argparse.Namespace) -> dict[str, Any]:
    source = Path(args.source).resolve()
    out = Path(args.results) / slug(torch, lightning)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    venv = Path(args.venvs).resolve() / slug(torch, lightning)
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = out / "install.log"
    python = str(venv / "bin" / "python")
    meta: dict[str, Any] = {
        "cell": slug(torch, lightning), "torch_requested": torch, "lightning_requested": lightning,
        "flavour": "both", "source": str(source), "commit": _commit(source),
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "pip_find_links": os.environ.get("PIP_FIND_LINKS"), "seconds": {},
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TOGGLESHIM_FLAVOUR", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    pins = [f"torch=={torch}", f"lightning=={lightning}", f"pytorch-lightning=={lightning}"]
    pip = [python, "-m", "pip", "install", "--no-input", "--no-compile"]  # bytecode on import: minutes less a cell
    steps = [
        ("venv", [args.python, "-m", "venv", str(venv)]),
        ("torch", [*pip, f"torch=={torch}"]),
        ("lightning", [*pip, *pins, *_constraint_args(source, torch, lightning)]),
        ("toggleshim", [*pip, "-e", f"{source}[dev]", *pins, *_constraint_args(source, torch, lightning)]),
    ]
    started = time.monotonic()
    for name, command in steps:
        code, seconds = _step(command, log, env=env)
        meta["seconds"][f"install_{name}"] = seconds
        if code != 0:
            meta["install_failed"] = f"{name} (exit {code})"
            tail = [line for line in log.read_text().splitlines() if line.strip()][-15:]
            meta["install_error"] = "\n".join(tail)
            break
    meta["seconds"]["install"] = round(time.monotonic() - started, 1)
    if "install_failed" not in meta:
        probe = subprocess.run([python, "-c", _PROBE, json.dumps(REPORTED), *MODULES], capture_output=True,
                               text=True, env=env, cwd=out)  # fmt: skip
        if probe.returncode == 0:
            meta.update(json.loads(probe.stdout.strip().splitlines()[-1]))
        else:
            meta["install_failed"] = "probe"
            meta["install_error"] = probe.stderr[-2000:]
    if "install_failed" not in meta:
        wanted = {"torch": torch, "lightning": lightning, "pytorch-lightning": lightning}
        wrong = [f"{d} {meta['versions'].get(d)} (asked {w})" for d, w in wanted.items()
                 if (meta["versions"].get(d) or "").split("+")[0] != w]  # fmt: skip
        if wrong:
            meta["install_failed"] = "versions: " + "; ".join(wrong)
    if "install_failed" not in meta:
        test_env = {**env, "HYPOTHESIS_PROFILE": "dev", "TOGGLESHIM_DERANDOMIZE": "1", "VIRTUAL_ENV": str(venv)}
        check = [python, "-m", "toggleshim", "check", "--json", str(out / "check.json"), *args.check_args]
        meta["check_command"] = shlex.join(["python", *check[1:3], *check[3:]])
        meta["check_exit"], meta["seconds"]["check"] = _step(check, out / "check.log", cwd=out, env=test_env,
                                                             timeout=args.timeout)  # fmt: skip
        pytest = [python, "-m", "pytest", "-n", str(args.workers), "-p", "no:cacheprovider",
                  f"--junitxml={out / 'junit.xml'}", *args.pytest_args]  # fmt: skip
        meta["pytest_command"] = shlex.join(["python", *pytest[1:]])
        meta["pytest_exit"], meta["seconds"]["pytest"] = _step(pytest, out / "pytest.log", cwd=source, env=test_env,
                                                               timeout=args.timeout)  # fmt: skip
    meta["seconds"]["total"] = round(time.monotonic() - started, 1)
    meta["recorded_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    write_failures(out)
    if not args.keep:  # rm, faster than shutil.rmtree, in the background during the next cell (`run` waits)
        DELETING.append(subprocess.Popen(["rm", "-rf", "--", str(venv)]))
    return meta


DELETING: list[subprocess.Popen[bytes]] = []  # the venvs being removed


def run(args: argparse.Namespace) -> int:
    wanted = {tuple(c.split(":", 1)) for c in args.cell or []}
    chosen = [
        c
        for c in cells()
        if (not args.torch or c[0] in args.torch)
        and (not args.lightning or c[1] in args.lightning)
        and (not wanted or c in wanted)
    ]
    if not chosen:
        print("torch_matrix run: no cell matches; `torch_matrix.py cells` lists them", file=sys.stderr)
        return 2
    status = 0
    for torch, lightning in chosen:
        print(f"{slug(torch, lightning)}: started {dt.datetime.now():%H:%M:%S}", flush=True)
        meta = run_cell(torch, lightning, args)
        row = _row(Path(args.results) / slug(torch, lightning))
        print(f"{slug(torch, lightning)}: {row['result']}; tests {row['tests']}; check {row['check']}; "
              f"{meta['seconds']['total']:.0f} s", flush=True)  # fmt: skip
        status = status or int(row["result"] != "pass")
    for deleting in DELETING:
        deleting.wait()
    if args.table:
        table(args)
    return status


# -- the table -----------------------------------------------------------------------------------


def _matrix_table() -> Any:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import matrix_table
    finally:
        sys.path.pop(0)
    return matrix_table


def _row(result_dir: Path) -> dict[str, Any]:
    meta = json.loads((result_dir / "meta.json").read_text())
    mt = _matrix_table()
    versions = meta.get("versions", {})
    row: dict[str, Any] = {
        "torch": versions.get("torch") or meta["torch_requested"],
        "lightning": versions.get("lightning") or meta["lightning_requested"],
        "python": meta.get("python", platform.python_version()),
        "commit": meta.get("commit") or "?",
        "date": meta.get("recorded_at", "")[:16].replace("T", " "),
        "minutes": round(meta.get("seconds", {}).get("total", 0) / 60, 1),
    }
    if meta.get("install_failed"):
        return {
            **row,
            "tests": "not run",
            "check": "not run",
            "check_properties": [],
            "result": f"install failed: {meta['install_failed']}",
        }
    counts = mt._junit_counts(result_dir / "junit.xml")
    if counts is None:
        code = meta.get("pytest_exit")
        tests = "none ran (pytest timed out)" if code == -1 else f"none ran (pytest exit {code}: suite did not load)"
    else:
        failed, errors, skipped = (int(counts[k]) for k in ("failures", "errors", "skipped"))
        tests = f"{int(counts['tests']) - failed - errors - skipped} / {failed} / {errors} / {skipped}"
    check_text, check_ok = mt._check_verdict(meta, result_dir / "check.json")
    try:
        report = json.loads((result_dir / "check.json").read_text())
        props = sorted({str(p.get("prop")) for p in report.get("properties", [])})
        probes = [p for p in report.get("torch", []) if isinstance(p, dict)]
    except (OSError, json.JSONDecodeError, AttributeError):
        report, props, probes = {}, [], []
    records = [p for p in report.get("properties", []) if isinstance(p, dict)] if isinstance(report, dict) else []
    if records and not check_ok:  # each failing property once (a property runs once a flavour)
        failing = dict.fromkeys(str(p.get("prop")) for p in records if p.get("verdict") != "pass")
        passed = sum(p.get("verdict") == "pass" for p in records)
        check_text = f"FAIL ({passed}/{len(records)} properties; failing: {', '.join(failing) or 'none'})"
    if probes:  # check's torch properties (the torch behaviours the block relies on), each flavour
        verdicts = [str(p.get("verdict")) for p in probes]
        text = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
        bad = sorted({f"{p.get('prop')}" for p in probes if p.get("verdict") not in ("pass", "n/a")})
        check_text += f"; torch properties: {text}" + (f" ({', '.join(bad)})" if bad else "")
    bad_imports = [m for m, e in meta.get("import_errors", {}).items() if e]
    if bad_imports:
        check_text += f"; {', '.join(bad_imports)} does not import"
    passed = meta.get("pytest_exit") == 0 and counts is not None and counts["tests"] > 0 and check_ok
    return {**row, "tests": tests, "check": check_text, "check_properties": props,
            "result": "pass" if passed and not bad_imports else "FAIL"}  # fmt: skip


def recorded_rows(data: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The rows ``data``'s ``measured.matrix`` already holds, by cell (torch without its local version, such as
    ``+cpu``; Lightning), "not run" rows left out: what ``table`` keeps for a cell with no result now."""
    try:
        rows = json.loads(data.read_text())["measured"]["matrix"]["rows"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return {}
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("result") not in (None, "", "not run"):
            kept[(str(row.get("torch", "")).split("+")[0], str(row.get("lightning", "")))] = row
    return kept


def table(args: argparse.Namespace) -> int:
    results = Path(args.results)
    earlier = recorded_rows(Path(args.data)) if args.data else {}
    rows = []
    for torch, lightning in sorted(cells(), key=lambda c: (_v(c[0]), _v(c[1]))):
        if (results / slug(torch, lightning) / "meta.json").exists():
            rows.append(_row(results / slug(torch, lightning)))
            write_failures(results / slug(torch, lightning))
        elif (torch, lightning) in earlier:  # not run now: the earlier run's row stays
            rows.append(earlier[(torch, lightning)])
        else:
            rows.append(
                {
                    "torch": torch,
                    "lightning": lightning,
                    "python": "",
                    "tests": "",
                    "check": "",
                    "check_properties": [],
                    "result": "not run",
                    "commit": "",
                    "date": "",
                    "minutes": 0,
                }
            )
    for r in rows:
        print(f"torch {r['torch']:<14} Lightning {r['lightning']:<12} {r['tests']:<22} {r['result']:<8} "
              f"{r['check']} {r['commit']} {r['date']}")  # fmt: skip
    if args.data:
        data = Path(args.data)
        numbers = json.loads(data.read_text())
        generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        numbers.setdefault("measured", {})["matrix"] = {"produced_by": args.command_label, "generated": generated,
                                                        "rows": rows}  # fmt: skip
        data.write_text(json.dumps(numbers, indent=2, ensure_ascii=False) + "\n")
        sys.path.insert(0, str(SCRIPTS))
        try:
            import docs_numbers
        finally:
            sys.path.pop(0)
        if data.resolve() == docs_numbers.DATA.resolve():
            for page in docs_numbers.render_all(numbers):
                print(f"rendered {page.relative_to(ROOT)}")
    return 0


COMMAND = ('`PIP_FIND_LINKS=<wheel dirs> python3 scripts/torch_matrix.py run --cell T:L`, one cell at a time, then '
           '`table` (a fresh venv a cell: torch, then both Lightning distributions with constraints/, then '
           '`-e ".[dev]"`; `check`, then `pytest -n 2`, profile `dev`, derandomized)')  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run cells (all by default), each in a fresh venv")
    r.add_argument("--source", default=str(ROOT), help="the toggleshim checkout to install and test")
    r.add_argument("--results", default=str(ROOT / "build" / "matrix"))
    r.add_argument("--venvs", default=str(ROOT / "build" / "matrix-venvs"), help="where the cells' venvs are made")
    r.add_argument("--python", default=sys.executable, help="the interpreter the venvs are made from")
    r.add_argument("--torch", action="append", help="only this torch (repeatable)")
    r.add_argument("--lightning", action="append", help="only this Lightning release (repeatable)")
    r.add_argument("--cell", action="append", metavar="TORCH:LIGHTNING", help="only this cell (repeatable)")
    r.add_argument("--keep", action="store_true", help="keep each cell's venv")
    r.add_argument("--workers", default="2", help="pytest -n (default 2)")
    r.add_argument("--timeout", type=float, default=3600, help="seconds for check, and for pytest (default 3600)")
    r.add_argument("--check-args", type=shlex.split, default=[], help="extra `toggleshim check` arguments")
    r.add_argument("--pytest-args", type=shlex.split, default=[], help="extra pytest arguments")
    r.add_argument("--table", action="store_true", help="then `table` (docs/docs_numbers.json, docs/compatibility.md)")
    for p in (r, sub.add_parser("table", help="record the last run of every cell in the docs")):
        if p is not r:
            p.add_argument("--results", default=str(ROOT / "build" / "matrix"))
        p.add_argument(
            "--data",
            default=str(ROOT / "docs" / "docs_numbers.json"),
            help="record the rows here and render the docs ('' for neither)",
        )
        p.add_argument("--command-label", default=COMMAND, help="Markdown naming the command that made the results")
    sub.add_parser("derive", help="re-read which Lightning accepts which torch, from the releases' metadata")
    sub.add_parser("cells", help="list the cells in the order `run` takes them")
    args = parser.parse_args(argv)
    for name in ("source", "results", "venvs"):  # the cells run elsewhere (check's --json is resolved there)
        if getattr(args, name, None):
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    if args.command == "cells":
        for torch, lightning in cells():
            print(f"{torch} {lightning}  ({slug(torch, lightning)})")
        return 0
    if args.command == "derive":
        return derive(args)
    return run(args) if args.command == "run" else table(args)


if __name__ == "__main__":
    sys.exit(main())
