"""A standard mutation score: cosmic-ray (PyPI) over the toggle, with the property suite as the test.

    python scripts/standard_mutation.py                      # every mutant of toggleshim/_toggle.py
    python scripts/standard_mutation.py --sample 80 --seed 1 # a uniform random sample of them
    python scripts/standard_mutation.py --module toggleshim/_patch.py

Beside the hand-planted bugs of ``toggleshim/testing/mutants.py`` (``scripts/mutation_score.py``),
which the same hands chose as the tests: cosmic-ray's operators mutate every comparison, boolean,
constant, loop and exception handler of the module. The committed tree (``git archive HEAD``) is
copied to a temporary directory, where each mutant is written to the file and the test command runs
in a fresh process: ``pytest`` over ``property_tests/test_equivalence.py``, ``test_stateful.py`` and
``test_hostile.py``, ``-x``, profile ``mutants`` (derandomized, no shrinking), one flavour.

Excluded as equivalent by construction: ``core/ReplaceBinaryOperator_BitOr_*`` (every ``|`` in the
module is in an annotation, ``X | None``, never evaluated under ``from __future__ import annotations``).
Needs ``pip install cosmic-ray``. Prints the counts, the score (killed / (killed + survived)) and each
survivor's diff; ``--keep DIR`` keeps the session (``cr-report DIR/session.sqlite --show-diff``).
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["property_tests/test_equivalence.py", "property_tests/test_stateful.py", "property_tests/test_hostile.py"]
PYTEST_ARGS = "-x -q -p no:randomly -p no:cacheprovider"
CONFIG = """\
[cosmic-ray]
module-path = "{module}"
timeout = {timeout}
excluded-modules = []
test-command = "env HYPOTHESIS_PROFILE=mutants TOGGLESHIM_FLAVOUR={flavour} {python} -m pytest {pytest_args} {tests}"

[cosmic-ray.distributor]
name = "local"

[cosmic-ray.filters.operators-filter]
exclude-operators = ["core/ReplaceBinaryOperator_BitOr_.*"]
"""


def _bin(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise SystemExit(f"{name} not found beside {sys.executable}: pip install cosmic-ray")
    return str(path)


def _sample(session: Path, n: int, seed: int) -> int:
    """Mark all but ``n`` pending mutants (chosen uniformly with ``seed``) as skipped."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        pending = sorted(item.job_id for item in db.pending_work_items)
        keep = set(random.Random(seed).sample(pending, min(n, len(pending))))
        for job_id in pending:
            if job_id not in keep:
                db.set_result(job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not sampled"))
        return len(pending)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="toggleshim/_toggle.py")
    parser.add_argument("--flavour", default="lightning.pytorch")
    parser.add_argument("--sample", type=int, default=0, help="run a uniform random sample of N mutants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant")
    parser.add_argument("--keep", metavar="DIR", help="work here and keep the session")
    args = parser.parse_args()

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="toggleshim-cr-"))
    work.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    (work / "cr.toml").write_text(CONFIG.format(module=args.module, timeout=args.timeout, flavour=args.flavour,
                                                python=sys.executable, tests=" ".join(TESTS),
                                                pytest_args=PYTEST_ARGS))
    session = work / "session.sqlite"
    session.unlink(missing_ok=True)
    subprocess.run([_bin("cosmic-ray"), "init", "cr.toml", str(session)], cwd=work, check=True)
    subprocess.run([_bin("cr-filter-operators"), str(session), "cr.toml"], cwd=work, check=True)
    sampled = ""
    if args.sample:
        total = _sample(session, args.sample, args.seed)
        sampled = f", a random sample of {args.sample} of the {total} non-excluded mutants (seed {args.seed})"
    start = time.perf_counter()
    subprocess.run([_bin("cosmic-ray"), "exec", "cr.toml", str(session)], cwd=work, check=True)
    minutes = (time.perf_counter() - start) / 60
    report = subprocess.run([_bin("cr-report"), str(session), "--show-diff"], cwd=work, capture_output=True,
                            text=True).stdout
    print(_summary(session, f"{args.module} on commit {commit}{sampled}; {minutes:.0f} min"))
    print("\n## survivors\n")
    print("\n".join(_survivors(report)))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _summary(session: Path, what: str) -> str:
    import sqlite3

    rows = sqlite3.connect(str(session)).execute(
        "select coalesce(test_outcome, worker_outcome), count(*) from work_results group by 1").fetchall()
    counts = {str(k): v for k, v in rows}
    killed, survived = counts.get("KILLED", 0), counts.get("SURVIVED", 0)
    lines = [f"cosmic-ray: {what}", "", "| outcome | mutants |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(counts.items())]
    if killed + survived:
        lines.append(f"\nscore: {killed}/{killed + survived} = {100 * killed / (killed + survived):.1f}% killed")
    return "\n".join(lines)


def _survivors(report: str) -> list[str]:
    """The diff of every surviving mutant (cr-report's blocks whose outcome is SURVIVED)."""
    blocks = report.split("\n[job-id]")
    return [b.strip() for b in blocks if "test outcome: TestOutcome.SURVIVED" in b]


if __name__ == "__main__":
    sys.exit(main())
