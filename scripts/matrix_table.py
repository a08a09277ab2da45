"""Record one version-matrix result, and turn all of them into a Markdown compatibility table.

    python scripts/matrix_table.py record --dir DIR --flavour F --lightning V [--pytest-exit N]
                                          [--check-exit N]
    python scripts/matrix_table.py table [--results build/matrix] [--output docs/compatibility.md]

``record`` runs inside the environment under test (a nox session or a CI job): it writes
``DIR/meta.json`` with the installed versions, and fails when the environment is not the one asked
for (another Lightning version, the ``lightning`` distribution in a ``pytorch_lightning`` env, or a
``pytorch-lightning`` of another version beside ``lightning``). ``table`` reads every
``*/meta.json`` below ``--results``, with the ``junit.xml`` (pytest ``--junitxml``) and ``check.json``
(``python -m toggleshim check --json``) beside it, writes the table to ``--output`` and prints it.
Standard library only, so that it runs under any interpreter.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata as metadata
import json
import platform
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

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


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text)) or (10**9,)


def _row(result_dir: Path) -> dict[str, Any]:
    meta = json.loads((result_dir / "meta.json").read_text())
    versions = meta.get("versions", {})
    dist = DISTRIBUTIONS.get(meta.get("flavour", ""), "lightning")
    lightning = versions.get(dist) or meta.get("lightning_requested", "?")
    counts = _junit_counts(result_dir / "junit.xml")
    check_text, check_ok = _check_verdict(meta, result_dir / "check.json")
    pytest_exit = meta.get("pytest_exit")
    if pytest_exit is None:
        tests, result = "not run", "not run"
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
    return {
        "lightning": lightning,
        "flavour": meta.get("flavour", "?"),
        "python": meta.get("python", "?"),
        "torch": versions.get("torch") or "?",
        "tests": tests,
        "time": f"{counts['time']:.0f} s" if counts else "",
        "check": check_text,
        "result": result,
        "recorded_at": meta.get("recorded_at", ""),
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
        "distribution alone.",
        "",
        "| Lightning | flavour | Python | torch | tests | time | check | result | recorded |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        check = r["check"].replace("|", "\\|")
        lines.append(
            f"| {r['lightning']} | {r['flavour']} | {r['python']} | {r['torch']} | {r['tests']} "
            f"| {r['time']} | {check} | {r['result']} | {r['recorded_at'][:16].replace('T', ' ')} |"
        )
    if not rows:
        lines.append("| (no results) | | | | | | | | |")
    text = "\n".join(lines) + "\n"
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    print(text, end="")
    failed = [r for r in rows if r["result"] not in ("pass", "not run")]
    return 1 if (args.strict and failed) else 0


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
    args = parser.parse_args(argv)
    return record(args) if args.command == "record" else table(args)


if __name__ == "__main__":
    sys.exit(main())
