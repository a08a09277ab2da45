"""Record one version-matrix result, and turn all of them into a Markdown compatibility table.

    python scripts/matrix_table.py record --dir DIR --flavour F --lightning V [--pytest-exit N]
                                          [--check-exit N]
    python scripts/matrix_table.py table [--results build/matrix] [--output FILE.md]
    nice -n 10 python scripts/matrix_table.py check-all [--examples 30] [--seed 0] [--env SUBSTRING]
                                                        [--json-dir /tmp/matrix]

``record`` runs inside the environment under test (a nox session or a CI job): it writes
``DIR/meta.json`` with the installed versions, and fails when the environment is not the one asked
for (another Lightning version, the ``lightning`` distribution in a ``pytorch_lightning`` env, or a
``pytorch-lightning`` of another version beside ``lightning``). ``table`` reads every
``*/meta.json`` below ``--results``, with the ``junit.xml`` (pytest ``--junitxml``) and ``check.json``
(``python -m toggleshim check --json``) beside it, writes the table to ``--output`` and prints it.
The table of ``docs/compatibility.md`` is not this one: it is the torch x Lightning matrix of
``scripts/torch_matrix.py`` (its ``table``), which reuses this module's readers of junit.xml and check.json.
``check-all`` runs ``python -m toggleshim check`` alone (no pytest) in each nox matrix venv already
built under ``.nox/`` (``nox -s matrix --install-only``), one venv after the other, records it in
``build/matrix/<session>/`` (keeping that session's pytest result when the venv's versions are
unchanged) and prints the table. Niceness is inherited by the venvs' processes. Standard library only,
so that it runs under any interpreter.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata as metadata
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
DISTRIBUTIONS = {"lightning": "lightning", "pytorch_lightning": "pytorch-lightning"}
MODULES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}
REPORTED = [
    "torch", "lightning", "pytorch-lightning", "lightning-utilities", "torchmetrics", "numpy",
    "setuptools", "hypothesis", "pytest", "toggleshim",
]  # fmt: skip


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    """The toggleshim checkout's commit (``+dirty`` when the package or tests differ from it), if a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        paths = ["toggleshim", "tests", "property_tests", "conftest.py"]
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", *paths], capture_output=True,
                               text=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def record(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if not meta:
        versions = {dist: _version(dist) for dist in REPORTED}
        problems = []
        wanted = DISTRIBUTIONS[args.flavour]
        if args.lightning != "latest" and versions[wanted] != args.lightning:
            problems.append(f"{wanted} {versions[wanted]} installed, {args.lightning} asked for")
        if args.flavour == "pytorch_lightning" and versions["lightning"] is not None:
            problems.append(f"lightning {versions['lightning']} present in a pytorch_lightning-only env")
        companion = versions["pytorch-lightning"]  # `lightning` pulls it in, unversioned
        if args.flavour == "lightning" and companion not in (None, versions["lightning"]):
            problems.append(f"pytorch-lightning {companion} beside lightning {versions['lightning']}")
        if problems:
            print("matrix_table record: wrong environment: " + "; ".join(problems), file=sys.stderr)
            return 2
        try:
            importlib.import_module(MODULES[args.flavour])
            import_error = None
        except Exception as exc:  # recorded for the table; the tests will fail on it too
            import_error = f"{type(exc).__name__}: {exc}"
        meta = {
            "flavour": args.flavour,
            "lightning_requested": args.lightning,
            "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}",
            "versions": versions,
            "import_error": import_error,
            "commit": _commit(),
        }
    if args.pytest_exit is not None:
        meta["pytest_exit"] = args.pytest_exit
    if args.check_exit is not None:
        meta["check_exit"] = args.check_exit
    meta["recorded_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return 0


def _junit_counts(path: Path) -> dict[str, float] | None:
    if not path.exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
    counts = {"tests": 0.0, "failures": 0.0, "errors": 0.0, "skipped": 0.0, "time": 0.0}
    for suite in suites:
        for key in counts:
            counts[key] += float(suite.get(key, 0) or 0)
    return counts


def _check_verdict(meta: dict[str, Any], path: Path) -> tuple[str, bool]:
    """(text, ok) for the ``toggleshim check`` cell; ok is True also when the check did not run."""
    data: Any = None
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            return "unreadable JSON", False
    exit_code = meta.get("check_exit")
    if data is None and exit_code is None:
        return "not run", True
    if isinstance(data, dict):
        if isinstance(data.get("verdict"), str):
            verdict = data["verdict"]
            return verdict, exit_code in (0, None) and verdict.lower() in {"ok", "pass", "passed"}
        if isinstance(data.get("ok"), bool):
            ok = data["ok"] and exit_code in (0, None)
            props = [p for p in data.get("properties", []) if isinstance(p, dict)]
            failed = [str(p.get("prop", "?")) for p in props if p.get("verdict") != "pass"]
            if not props:
                return ("ok" if ok else "FAIL"), ok
            if ok and not failed:
                return f"ok ({len(props)}/{len(props)} properties)", True
            return f"FAIL ({', '.join(failed) or f'exit {exit_code}'})", False
    return ("ok", True) if exit_code == 0 else (f"FAIL (exit {exit_code})", False)


def _check_details(path: Path) -> tuple[str, str]:
    """(examples, seconds) cells from ``check.json`` (empty when absent or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return "", ""
    if not isinstance(data, dict):
        return "", ""
    props = [p for p in data.get("properties", []) if isinstance(p, dict)]
    examples = sum(int(p.get("examples", 0) or 0) for p in props)
    requested = data.get("examples")
    examples_text = f"{examples} ({requested} a property)" if props and requested is not None else ""
    seconds = data.get("seconds")
    return examples_text, (f"{float(seconds):.1f} s" if isinstance(seconds, (int, float)) else "")


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text)) or (10**9,)


def _commit_cell(meta: dict[str, Any]) -> str:
    """The toggleshim commit the row's results came from (tests and check, when they differ)."""
    tests, check = meta.get("commit"), meta.get("check_commit")
    if check and check != tests and meta.get("pytest_exit") is not None:
        return f"tests {tests or '?'}, check {check}"
    return str(check or tests or "")


def _row(result_dir: Path) -> dict[str, Any]:
    meta = json.loads((result_dir / "meta.json").read_text())
    versions = meta.get("versions", {})
    dist = DISTRIBUTIONS.get(meta.get("flavour", ""), "lightning")
    lightning = versions.get(dist) or meta.get("lightning_requested", "?")
    counts = _junit_counts(result_dir / "junit.xml")
    check_text, check_ok = _check_verdict(meta, result_dir / "check.json")
    pytest_exit = meta.get("pytest_exit")
    if pytest_exit is None:
        tests = "not run"
        if meta.get("check_exit") is None and not (result_dir / "check.json").exists():
            result = "not run"
        else:  # `check-all`: the check alone
            result = "check pass" if check_ok else "FAIL"
    else:
        if counts is None:
            tests = "no junit xml"
        else:
            failed, errors, skipped = (int(counts[k]) for k in ("failures", "errors", "skipped"))
            passed = int(counts["tests"]) - failed - errors - skipped
            tests = f"{passed} / {failed} / {errors} / {skipped}"
        if pytest_exit == 5 or (counts is not None and counts["tests"] == 0):
            result = "NO TESTS"
        elif pytest_exit == 0 and check_ok:
            result = "pass"
        else:
            result = "FAIL"
    if meta.get("import_error"):
        check_text += f"; import error: {meta['import_error'][:80]}"
    check_examples, check_time = _check_details(result_dir / "check.json")
    return {
        "lightning": lightning,
        "flavour": meta.get("flavour", "?"),
        "python": meta.get("python", "?"),
        "torch": versions.get("torch") or "?",
        "tests": tests,
        "time": f"{counts['time']:.0f} s" if counts else "",
        "check": check_text,
        "check_examples": check_examples,
        "check_time": check_time,
        "result": result,
        "recorded_at": meta.get("recorded_at", ""),
        "commit": _commit_cell(meta),
    }


def table(args: argparse.Namespace) -> int:
    results = Path(args.results)
    dirs = sorted(p.parent for p in results.glob("**/meta.json"))
    rows = [_row(d) for d in dirs]
    rows.sort(key=lambda r: (_version_key(r["lightning"]), r["flavour"], _version_key(r["python"]),
                             _version_key(r["torch"])))  # fmt: skip
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Compatibility",
        "",
        "toggleshim's test-suite and `toggleshim check` per Lightning release and flavour. Generated by "
        f"`scripts/matrix_table.py` on {now} from {len(rows)} result(s) in "
        f"`{args.results_label or results}`.",
        "Tests: passed / failed / errors / skipped (pytest's JUnit XML). `lightning` means the `lightning` "
        "distribution imported as `lightning.pytorch`; `pytorch_lightning` means the `pytorch-lightning` "
        "distribution alone. check: `python -m toggleshim check` (properties passed), its examples "
        "(all properties; hand-picked worlds included) and its time. result: `check pass` where only the "
        "check ran.",
        "",
    ]
    if args.command_label:
        lines[2:2] = [f"Produced by: {args.command_label}", ""]
    lines += [
        "| Lightning | flavour | Python | torch | tests | time | check | check examples | check time | result "
        "| recorded | commit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        check = r["check"].replace("|", "\\|")
        lines.append(
            f"| {r['lightning']} | {r['flavour']} | {r['python']} | {r['torch']} | {r['tests']} "
            f"| {r['time']} | {check} | {r['check_examples']} | {r['check_time']} | {r['result']} "
            f"| {r['recorded_at'][:16].replace('T', ' ')} | {r['commit']} |"
        )
    if not rows:
        lines.append("| (no results) | | | | | | | | | | | |")
    text = "\n".join(lines) + "\n"
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    print(text, end="")
    failed = [r for r in rows if r["result"] not in ("pass", "check pass", "not run")]
    return 1 if (args.strict and failed) else 0


_VENV = re.compile(r"^matrix-lightning-(?P<lightning>.+)-flavour-(?P<flavour>lightning|pytorch_lightning)$")


def _matrix_venvs(nox_dir: Path) -> list[tuple[Path, str, str]]:
    """(venv, lightning version, flavour) of every nox ``matrix`` venv, oldest Lightning first."""
    found = []
    for venv in nox_dir.glob("matrix-*"):
        match = _VENV.match(venv.name)
        if match and (venv / "bin" / "python").exists():
            # nox spells 2.0.9.post0 as 2-0-9-post0; `record` checks the version against the venv
            found.append((venv, match["lightning"].replace("-", "."), match["flavour"]))
    return sorted(found, key=lambda v: (_version_key(v[1]), v[2]))


def check_all(args: argparse.Namespace) -> int:
    """``python -m toggleshim check`` in every nox matrix venv, one after the other, then the table."""
    venvs = [v for v in _matrix_venvs(Path(args.nox_dir)) if not args.env or any(e in v[0].name for e in args.env)]
    if not venvs:
        print(f"matrix_table check-all: no nox matrix venvs in {args.nox_dir} (nox -s matrix --install-only)",
              file=sys.stderr)  # fmt: skip
        return 2
    results = Path(args.results)
    json_dir = Path(args.json_dir) if args.json_dir else None
    if json_dir:
        json_dir.mkdir(parents=True, exist_ok=True)
    problems = []
    for venv, lightning, flavour in venvs:
        python = str(venv / "bin" / "python")
        name = f"{flavour}-{lightning}"
        with tempfile.TemporaryDirectory() as tmp:  # the venv as it is now (and refuse a wrong one)
            rec = subprocess.run([python, str(Path(__file__).resolve()), "record", "--dir", tmp, "--flavour", flavour,
                                  "--lightning", lightning], capture_output=True, text=True)  # fmt: skip
            if rec.returncode != 0:
                problems.append(f"{name}: {rec.stderr.strip() or f'record exited {rec.returncode}'}")
                print(f"{name}: SKIPPED, {problems[-1]}", flush=True)
                continue
            fresh = json.loads((Path(tmp) / "meta.json").read_text())
        out = results / f"py{'.'.join(fresh['python'].split('.')[:2])}-{flavour}-{lightning}"
        out.mkdir(parents=True, exist_ok=True)
        check_json = out / "check.json"
        check_json.unlink(missing_ok=True)
        command = [python, "-m", "toggleshim", "check", "--examples", str(args.examples), "--seed", str(args.seed),
                   "--flavour", MODULES[flavour], "--json", str(check_json)]  # fmt: skip
        env = {**os.environ, "TOGGLESHIM_FLAVOUR": MODULES[flavour]}
        started = time.monotonic()
        try:
            run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
            exit_code, stdout, stderr = run.returncode, run.stdout, run.stderr
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            exit_code, stdout, stderr = -1, partial, f"timed out after {args.timeout} s"
        wall = time.monotonic() - started
        output = stdout + ("\n--- stderr ---\n" + stderr if stderr else "")
        # the report's closing line is on stdout; a traceback (import error, crash) ends stderr
        lines = [line for line in (stdout if exit_code in (0, 1) else stderr or stdout).splitlines() if line.strip()]
        closing = lines[-1] if lines else "(no output)"
        print(f"{name}: exit {exit_code}, {wall:.0f} s: {closing}", flush=True)
        if exit_code != 0:
            problems.append(f"{name}: exit {exit_code}: {closing}")
            (out / "check.log").write_text(output)
        meta_path = out / "meta.json"
        old: dict[str, Any] = {}
        if meta_path.exists():
            try:
                old = json.loads(meta_path.read_text())
            except json.JSONDecodeError:
                old = {}
        # keep that session's pytest result only while it describes the same installed versions
        meta = old if old.get("versions") == fresh["versions"] and old.get("flavour") == flavour else fresh
        meta["check_exit"] = exit_code
        meta["check_command"] = shlex.join(command[1:])
        meta["check_commit"] = _commit()
        meta["recorded_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
        if json_dir and check_json.exists():
            shutil.copyfile(check_json, json_dir / f"{name}.json")
    label = "`" + shlex.join(["nice", "-n", "10", "python", "scripts/matrix_table.py", "check-all", "--examples",
                        str(args.examples), *(["--seed", str(args.seed)] if args.seed else []),
                        *(f"--env={e}" for e in args.env or [])])  # fmt: skip
    label += (f"` (in each venv, one at a time: `python -m toggleshim check --examples {args.examples} "
              f"--seed {args.seed} --flavour <lightning.pytorch|pytorch_lightning> "
              "--json build/matrix/<session>/check.json`)")  # fmt: skip
    status = table(argparse.Namespace(results=str(results), results_label=args.results_label, output=args.output,
                                      strict=False, command_label=label))  # fmt: skip
    for problem in problems:
        print(f"check-all: {problem}", file=sys.stderr)
    return 1 if problems else status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="write DIR/meta.json for the current environment")
    rec.add_argument("--dir", required=True)
    rec.add_argument("--flavour", required=True, choices=sorted(DISTRIBUTIONS))
    rec.add_argument("--lightning", required=True, help="the version asked for, or 'latest'")
    rec.add_argument("--pytest-exit", type=int)
    rec.add_argument("--check-exit", type=int)
    tab = sub.add_parser("table", help="write the Markdown table")
    tab.add_argument("--results", default="build/matrix")
    tab.add_argument("--results-label", help="how to name the results in the text (default: the path)")
    tab.add_argument("--output", help="file to write (also printed)")
    tab.add_argument("--strict", action="store_true", help="exit 1 when any row failed")
    tab.add_argument("--command-label", help="Markdown naming the command that produced the results")
    chk = sub.add_parser("check-all", help="`python -m toggleshim check` in every .nox/matrix-* venv, then the table")
    chk.add_argument("--nox-dir", default=str(ROOT / ".nox"))
    chk.add_argument("--results", default=str(ROOT / "build" / "matrix"))
    chk.add_argument("--results-label", default="build/matrix", help="how to name the results in the text")
    chk.add_argument("--output", help="also write the Markdown table to this file (it is printed)")
    chk.add_argument("--examples", type=int, default=30, help="random worlds a property (default 30)")
    chk.add_argument("--seed", type=int, default=0)
    chk.add_argument("--env", action="append", help="only venvs whose name contains this (repeatable)")
    chk.add_argument("--json-dir", help="also copy each report to DIR/<flavour>-<version>.json")
    chk.add_argument("--timeout", type=float, default=1800, help="seconds a venv (default 1800)")
    args = parser.parse_args(argv)
    if args.command == "record":
        return record(args)
    return check_all(args) if args.command == "check-all" else table(args)


if __name__ == "__main__":
    sys.exit(main())
