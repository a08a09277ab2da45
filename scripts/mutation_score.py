"""Measure the property suite: plant each bug of ``toggleshim.testing.mutants`` and expect a failure.

    python scripts/mutation_score.py                 # every mutant, then the unaltered code
    python scripts/mutation_score.py --only "step on exception"
    python scripts/mutation_score.py --kind shim     # the shim's bugs only

Each mutant runs ``pytest property_tests -x`` (the migrate property excluded: it does not toggle) in
a fresh process with ``TOGGLESHIM_MUTANT`` set (the root conftest plants it) under the ``mutants``
profile: derandomized, without shrinking (a caught mutant needs no minimal example). The score is
caught / planted; the unaltered run must pass.
Prints a Markdown table (``--json PATH`` for a machine-readable copy). A run of every mutant is
recorded in ``docs/docs_numbers.json`` (``measured.mutation_score``, with the commit), from which
``scripts/docs_numbers.py`` renders the score in docs/testing.md (``--no-data``: not recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toggleshim.testing.mutants import LIGHTNING, SHIM  # noqa: E402


def run(mutant: str | None, flavour: str) -> tuple[bool, float, str]:
    env = {**os.environ, "HYPOTHESIS_PROFILE": "mutants", "TOGGLESHIM_FLAVOUR": flavour}
    env.pop("TOGGLESHIM_MUTANT", None)
    if mutant:
        env["TOGGLESHIM_MUTANT"] = mutant
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "property_tests", "--ignore=property_tests/test_migrate_property.py",
         "-x", "-q", "-p", "no:randomly", "-n", "auto"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    return proc.returncode == 0, time.perf_counter() - start, last


def _record(rows: list[dict[str, object]]) -> None:
    """A full run, the unaltered code passing, into docs/docs_numbers.json; the docs rendered from it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_numbers

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    data = json.loads(docs_numbers.DATA.read_text())
    data.setdefault("measured", {})["mutation_score"] = {
        "caught": sum(bool(r["caught"]) for r in rows), "mutants": [r["mutant"] for r in rows],
        "commit": commit.stdout.strip() or "unknown", "cores": os.cpu_count(),
    }
    docs_numbers.DATA.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    docs_numbers.render_all(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="only this mutant (repeatable)")
    parser.add_argument("--kind", choices=["all", "shim", "lightning"], default="all",
                        help="the shim's bugs, the Lightning releases, or both")
    parser.add_argument("--flavour", default="lightning.pytorch")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--no-data", action="store_true", help="do not record a full run in docs/docs_numbers.json")
    args = parser.parse_args()
    names = args.only or [*(LIGHTNING if args.kind != "shim" else []), *(SHIM if args.kind != "lightning" else [])]
    rows = []
    print("| mutant | kind | caught | seconds | pytest |\n|---|---|---|---:|---|", flush=True)
    for name in names:
        passed, seconds, last = run(name, args.flavour)
        kind = "Lightning release" if name in LIGHTNING else "shim bug"
        rows.append({"mutant": name, "kind": kind, "caught": not passed, "seconds": round(seconds, 1), "last": last})
        print(f"| {name} | {kind} | {'yes' if not passed else '**NO**'} | {seconds:.0f} | {last} |", flush=True)
    clean_passed, seconds, last = run(None, args.flavour)
    caught = sum(r["caught"] for r in rows)
    print(f"| (unaltered code) | - | {'passes' if clean_passed else '**FAILS**'} | {seconds:.0f} | {last} |")
    print(f"\nscore: {caught}/{len(rows)} mutants caught; unaltered code {'passes' if clean_passed else 'FAILS'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "clean_passes": clean_passed}, indent=2) + "\n")
    if not args.no_data and not args.only and args.kind == "all" and clean_passed:
        _record(rows)
    return 0 if caught == len(rows) and clean_passed else 1


if __name__ == "__main__":
    sys.exit(main())
