"""Measure the README's numbers and write them into it: never typed by hand.

    python scripts/readme_numbers.py            # everything: count, `pytest -n auto` wall time, examples/gan.py
    python scripts/readme_numbers.py --count    # only the test count (after adding or removing tests)
    python scripts/readme_numbers.py --render   # rewrite the README line from docs/readme_numbers.json

What it measures goes to ``docs/readme_numbers.json`` with the commit it was measured at and the
machine's cores; the README's line between the ``readme-numbers`` markers is rendered from that file,
and so are the docs' numbers blocks (``scripts/docs_numbers.py``, which reads the test count from it).
``tests/test_readme.py`` fails when the README's line is not the rendering of the file, or when the
count in the file is not the number of tests the tree collects now. Times are as measured at the
recorded commit (run the whole script on an idle machine to refresh them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NUMBERS = ROOT / "docs" / "readme_numbers.json"
MARK = re.compile(r"<!-- readme-numbers -->.*?<!-- /readme-numbers -->", re.DOTALL)


def _default_env() -> dict[str, str]:
    """This environment without a Hypothesis profile: the README's `pytest -n auto` runs the default."""
    return {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}


def collected() -> int:
    """The tests ``pytest -n auto`` runs: what the tree collects (the default Hypothesis profile)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly"],
                          cwd=ROOT, capture_output=True, text=True, env=_default_env(), timeout=600, check=False)
    found = re.search(r"^(\d+) tests? collected", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"pytest --collect-only: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return int(found.group(1))


def render(numbers: dict[str, object]) -> str:
    if "suite_seconds" not in numbers:  # counted, not timed yet
        return f"<!-- readme-numbers -->{numbers['tests']} tests (times not measured yet)<!-- /readme-numbers -->"
    minutes = float(numbers["suite_seconds"]) / 60  # type: ignore[arg-type]
    return (
        f"<!-- readme-numbers -->{numbers['tests']} tests, {minutes:.1f} min with `pytest -n auto` on "
        f"{numbers['cores']} idle cores; `python examples/gan.py`: {numbers['gan_seconds']:.0f} s "
        f"(`scripts/readme_numbers.py`, commit {numbers['commit']})<!-- /readme-numbers -->"
    )


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _timed(cmd: list[str], **kwargs: object) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}")
    return round(time.perf_counter() - start, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", action="store_true", help="only the test count")
    parser.add_argument("--render", action="store_true", help="only rewrite the README line from the JSON")
    args = parser.parse_args()
    numbers: dict[str, object] = json.loads(NUMBERS.read_text()) if NUMBERS.exists() else {}
    if not args.render:
        numbers["tests"] = collected()
        if not args.count:
            numbers["suite_seconds"] = _timed([sys.executable, "-m", "pytest", "-n", "auto", "-q"], env=_default_env())
            with tempfile.TemporaryDirectory() as tmp:
                numbers["gan_seconds"] = _timed([sys.executable, "examples/gan.py", "--out", f"{tmp}/gan.png"],
                                                stdout=subprocess.DEVNULL)
            numbers["commit"], numbers["cores"] = _commit(), os.cpu_count()
        NUMBERS.write_text(json.dumps(numbers, indent=2, sort_keys=True) + "\n")
    text = README.read_text()
    if not MARK.search(text):
        raise SystemExit("README.md has no <!-- readme-numbers --> line")
    README.write_text(MARK.sub(render(numbers), text))
    print(render(numbers))
    import docs_numbers  # beside this script: the docs' blocks read the count from the same file

    return docs_numbers.main([] if not args.render else ["--render"])


if __name__ == "__main__":
    sys.exit(main())
