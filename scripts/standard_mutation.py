"""A standard mutation score: cosmic-ray (PyPI) over the core, with the property suite as the test.

    python scripts/standard_mutation.py                      # every mutant of toggleshim/_toggle.py
    python scripts/standard_mutation.py --module toggleshim/_block.py   # (or _writes.py: the core's three)
    python scripts/standard_mutation.py --sample 80 --seed 1 # a uniform random sample of them
    python scripts/standard_mutation.py --module toggleshim/_patch.py
    python scripts/standard_mutation.py --compare 24 --seed 5 # the fork server against fresh processes
    python scripts/standard_mutation.py --lines 376,667 --rev 1771d67  # some lines, another commit
    python scripts/standard_mutation.py --resume DIR          # finish a stopped run kept with --keep DIR
    python scripts/standard_mutation.py --survivors-of DIR --rev HEAD  # a kept run's survivors, again
    python scripts/standard_mutation.py --survivors-of DIR --tests tests/test_gate.py  # by other tests
    python scripts/standard_mutation.py --shard 0/2 --keep A & python scripts/standard_mutation.py --shard 1/2 --keep B

Beside the hand-planted bugs of ``toggleshim/testing/mutants.py`` (``scripts/mutation_score.py``),
which the same hands chose as the tests: cosmic-ray's operators mutate every comparison, boolean,
constant, loop and exception handler of the module. The committed tree (``git archive HEAD``) is
copied to a temporary directory, where each mutant is written to the file and the test command runs:
``pytest`` over ``property_tests/test_equivalence.py``, ``test_stateful.py``, ``test_hostile.py``,
``test_fallback.py`` and ``test_install.py``, ``-x``, profile ``mutants`` (derandomized, no
shrinking), one flavour.

The runner (``--runner``): ``fork`` (the default) runs each mutant's pytest in a child forked from
``scripts/mutation_forkserver.py``, a server that imported torch once (~8 s less per mutant); the
test command cosmic-ray runs and times out is that server's client. ``fresh`` is
``python -m pytest`` in a fresh process. ``--compare N`` runs a sample of N mutants with both
(cosmic-ray's own ``mutate_and_test``, alternating which runner goes first), prints each mutant's
two verdicts and times, and fails if any verdict differs.

Excluded as equivalent by construction, in a module under ``from __future__ import annotations``:
``core/ReplaceBinaryOperator_BitOr_*`` (every ``|`` of ``_toggle.py``, ``_block.py`` and
``_writes.py`` is in an annotation, ``X | None``, never evaluated there; ``_patch.py`` evaluates its
annotations, so there they run). Needs cosmic-ray: ``pip install -c constraints/tools.txt -e ".[mutation]"`` (pinned
there). Prints the counts, the score (killed / (killed + survived)), the time per mutant and each
survivor's diff; ``--keep DIR`` keeps the session (``cr-report DIR/session.sqlite --show-diff``).
``--lines 376,667`` runs only the mutants that start on those lines of the module, ``--rev REV`` a
committed tree other than ``HEAD`` (to show a draw kills a mutant that survived before it).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FORKSERVER = ROOT / "scripts" / "mutation_forkserver.py"
TESTS = ["property_tests/test_equivalence.py", "property_tests/test_stateful.py", "property_tests/test_hostile.py",
         "property_tests/test_fallback.py", "property_tests/test_install.py"]
PYTEST_ARGS = "-x -q -p no:randomly -p no:cacheprovider"
INSTALL = 'pip install -c constraints/tools.txt -e ".[mutation]"   (from the repository root)'
CONFIG = """\
[cosmic-ray]
module-path = "{module}"
timeout = {timeout}
excluded-modules = []
test-command = "{test_command}"

[cosmic-ray.distributor]
name = "local"

[cosmic-ray.filters.operators-filter]
exclude-operators = [{excluded}]
"""


def _bin(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise SystemExit(f"{name} not found beside {sys.executable}: cosmic-ray is not installed here.\n"
                         f"Install it with: {INSTALL}")
    return str(path)


def tests_for(module: str) -> list[str]:
    """The test files, in this order for every module (the fallback property goes after the shim's:
    for ``_patch.py`` it uninstalls and reinstalls the shim once Lightning is imported, which would
    mask a broken import hook from the tests after it; a mutant that installs no hook survived so)."""
    return TESTS


def test_command(runner: str, flavour: str, socket: Path | None = None, module: str = "",
                 tests_given: list[str] | None = None) -> str:
    """The command cosmic-ray runs for each mutant (from the copy of the tree)."""
    env = f"env HYPOTHESIS_PROFILE=mutants TOGGLESHIM_FLAVOUR={flavour} OMP_NUM_THREADS=1"
    tests = " ".join(tests_given or tests_for(module))
    if runner == "fresh":
        return f"{env} {sys.executable} -m pytest {PYTEST_ARGS} {tests}"
    return f"{env} {sys.executable} {FORKSERVER} run {socket} -- {PYTEST_ARGS} {tests}"


class ForkServer:
    """``scripts/mutation_forkserver.py serve``, started and stopped around a run."""

    def __init__(self, work: Path) -> None:
        self.socket = work / "forkserver.sock"
        self.log = work / "forkserver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ForkServer:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, str(FORKSERVER), "serve", str(self.socket)], stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        while "ready" not in self.log.read_text():
            if self.proc.poll() is not None:
                raise SystemExit(f"the fork server did not start:\n{self.log.read_text()}")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()


def _in_order(items: Any) -> list[str]:
    """The job ids of ``items`` in an order fixed by the mutants themselves (position, operator,
    occurrence), never by their job ids: cosmic-ray draws those at random in each session, so two runs
    (``--shard 0/2`` and ``1/2``, each its own session) sorting by job id would split the mutants
    differently, running some twice and others never."""
    def key(item: Any) -> list[tuple[str, int, int, str, int]]:
        return [(str(m.module_path), m.start_pos[0], m.start_pos[1], m.operator_name, m.occurrence)
                for m in item.mutations]

    return [item.job_id for item in sorted(items, key=key)]


def _sample(session: Path, n: int, seed: int) -> int:
    """Mark all but ``n`` pending mutants (chosen uniformly with ``seed``) as skipped."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        pending = _in_order(db.pending_work_items)
        keep = set(random.Random(seed).sample(pending, min(n, len(pending))))
        for job_id in pending:
            if job_id not in keep:
                db.set_result(job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not sampled"))
        return len(pending)


def _only_lines(session: Path, lines: set[int]) -> int:
    """Mark every pending mutant that does not start on one of ``lines`` as skipped."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        items = list(db.pending_work_items)
        for item in items:
            if item.mutations[0].start_pos[0] not in lines:
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="other line"))
        return sum(item.mutations[0].start_pos[0] in lines for item in items)


def _survivors_of(kept: Path) -> list[tuple[str, str, int]]:
    """Each survivor of a session kept with ``--keep``: (operator, the source line it mutates, column),
    read from the tree that session mutated, so that it is found again after lines moved."""
    config = (kept / "cr.toml").read_text()
    module = config.split('module-path = "', 1)[1].split('"', 1)[0]
    lines = subprocess.run(["git", "show", f"{_kept_rev(kept)}:{module}"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    rows = sqlite3.connect(str(kept / "session.sqlite")).execute(
        "select m.operator_name, m.start_pos_row, m.start_pos_col from mutation_specs m join work_results r"
        " on r.job_id = m.job_id where r.test_outcome = 'SURVIVED'").fetchall()
    return [(str(op), lines[row - 1].strip(), col - (len(lines[row - 1]) - len(lines[row - 1].lstrip())))
            for op, row, col in rows]


def _kept_rev(kept: Path) -> str:
    """The commit a kept session mutated (written there by ``--keep``)."""
    marker = kept / "rev.txt"
    if not marker.exists():
        raise SystemExit(f"{kept} has no rev.txt: keep the session with this script's --keep")
    return marker.read_text().strip()


def _only_survivors(session: Path, module_text: str, survivors: list[tuple[str, str, int]]) -> int:
    """Mark every pending mutant that is not one of ``survivors`` (same operator, same source line,
    same column in it) as skipped; how many are left."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    lines = module_text.splitlines()
    wanted = set(survivors)
    left = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            m = item.mutations[0]
            text = lines[m.start_pos[0] - 1]
            key = (m.operator_name, text.strip(), m.start_pos[1] - (len(text) - len(text.lstrip())))
            if key in wanted:
                left += 1
            else:
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not a survivor"))
    return left


def _shard(session: Path, k: int, n: int) -> int:
    """Keep the ``k``-th of ``n`` shares of the pending mutants (in :func:`_in_order`), so that ``n``
    runs, one per core, split a session; skip the rest. How many are left."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        pending = _in_order(db.pending_work_items)
        for i, job_id in enumerate(pending):
            if i % n != k:
                db.set_result(job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="other shard"))
        return len(pending[k::n])


def _prepare(args: argparse.Namespace, work: Path, command: str) -> tuple[Path, str]:
    """The committed tree in ``work``, cosmic-ray's config and an initialised session (sampled)."""
    archive = subprocess.run(["git", "archive", args.rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    source = (work / args.module).read_text()
    excluded = '"core/ReplaceBinaryOperator_BitOr_.*"' if "from __future__ import annotations" in source else ""
    (work / "cr.toml").write_text(CONFIG.format(module=args.module, timeout=args.timeout, test_command=command,
                                                excluded=excluded))
    session = work / "session.sqlite"
    session.unlink(missing_ok=True)
    subprocess.run([_bin("cosmic-ray"), "init", "cr.toml", str(session)], cwd=work, check=True)
    subprocess.run([_bin("cr-filter-operators"), str(session), "cr.toml"], cwd=work, check=True)
    sampled = ""
    if args.survivors_of:
        survivors = _survivors_of(Path(args.survivors_of).resolve())
        left = _only_survivors(session, source, survivors)
        sampled = f", the {left} of the {len(survivors)} survivors of {args.survivors_of} found again"
    if args.lines:
        total = _only_lines(session, {int(n) for n in args.lines.split(",")})
        sampled = f", the {total} mutants on lines {args.lines}"
    if args.shard:
        k, n_shards = (int(x) for x in args.shard.split("/"))
        left = _shard(session, k, n_shards)
        sampled += f", shard {k}/{n_shards} ({left} mutants)"
    n = args.sample or args.compare
    if n:
        total = _sample(session, n, args.seed)
        sampled = f", a random sample of {n} of the {total} non-excluded mutants (seed {args.seed})"
    from cosmic_ray.testing import run_tests
    from cosmic_ray.work_item import TestOutcome

    cwd = os.getcwd()
    os.chdir(work)
    try:
        outcome, output = run_tests(command, args.timeout)  # the unaltered tree must pass, or nothing counts
    finally:
        os.chdir(cwd)
    if outcome != TestOutcome.SURVIVED:
        raise SystemExit(f"the test command fails on the unaltered tree ({outcome}):\n{output[-3000:]}")
    return session, sampled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="toggleshim/_toggle.py")
    parser.add_argument("--flavour", default="lightning.pytorch")
    parser.add_argument("--sample", type=int, default=0, help="run a uniform random sample of N mutants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant")
    parser.add_argument("--runner", choices=["fork", "fresh"], default="fork")
    parser.add_argument("--compare", type=int, default=0, metavar="N",
                        help="run a sample of N mutants with both runners; fail if a verdict differs")
    parser.add_argument("--lines", help="only the mutants starting on these lines (comma-separated)")
    parser.add_argument("--rev", default="HEAD", help="the committed tree to mutate (default HEAD)")
    parser.add_argument("--keep", metavar="DIR", help="work here and keep the session")
    parser.add_argument("--survivors-of", metavar="DIR",
                        help="only the mutants that survived in a session kept with --keep (found by operator, "
                             "source line and column, so on another commit too)")
    parser.add_argument("--shard", metavar="K/N", help="only the K-th of N shares of the mutants (0-based), so that "
                        "N runs split the work, one per core")
    parser.add_argument("--tests", nargs="+", metavar="PATH",
                        help="the test files to run for each mutant instead of the property suite")
    parser.add_argument("--resume", metavar="DIR", help="finish the pending mutants of a session kept with --keep")
    args = parser.parse_args()
    _bin("cosmic-ray")
    if args.resume:
        return _resume(Path(args.resume).resolve())

    commit = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    work = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="toggleshim-cr-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        if args.compare:
            return _compare(args, work, commit)
        with ForkServer(work) if args.runner == "fork" else _no_server() as server:
            command = test_command(args.runner, args.flavour, getattr(server, "socket", None), args.module,
                                   args.tests)
            (work / "rev.txt").write_text(subprocess.run(["git", "rev-parse", args.rev], cwd=ROOT, capture_output=True,
                                                         text=True, check=True).stdout)
            session, sampled = _prepare(args, work, command)
            start = time.perf_counter()
            subprocess.run([_bin("cosmic-ray"), "exec", "cr.toml", str(session)], cwd=work, check=True)
            seconds = time.perf_counter() - start
        report = subprocess.run([_bin("cr-report"), str(session), "--show-diff"], cwd=work, capture_output=True,
                                text=True).stdout
        tests = f"; tests {' '.join(args.tests)}" if args.tests else ""
        print(_summary(session, f"{args.module} on commit {commit}{sampled}; runner {args.runner}{tests}", seconds))
        print("\n## survivors\n")
        print("\n".join(_survivors(report)))
        return 1 if _runner_errors(session) else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


class _no_server:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass


def _resume(work: Path) -> int:
    """Run what a stopped ``--keep`` session left pending: the same tree, config and runner."""
    session = work / "session.sqlite"
    pending = sqlite3.connect(str(session)).execute(
        "select count(*) from work_items where job_id not in (select job_id from work_results)").fetchone()[0]
    os.environ["OMP_NUM_THREADS"] = "1"
    fork = "mutation_forkserver" in (work / "cr.toml").read_text()
    with ForkServer(work) if fork else _no_server():
        start = time.perf_counter()
        subprocess.run([_bin("cosmic-ray"), "exec", "cr.toml", str(session)], cwd=work, check=True)
        seconds = time.perf_counter() - start
    report = subprocess.run([_bin("cr-report"), str(session), "--show-diff"], cwd=work, capture_output=True,
                            text=True).stdout
    print(_summary(session, f"the session in {work}, resumed", seconds, pending))
    print("\n## survivors\n")
    print("\n".join(_survivors(report)))
    return 1 if _runner_errors(session) else 0


def _results(session: Path) -> list[tuple[str, str, str]]:
    """(job id, outcome, output) of every mutant that ran (not the skipped ones)."""
    rows = sqlite3.connect(str(session)).execute(
        "select job_id, coalesce(test_outcome, worker_outcome), output from work_results").fetchall()
    return [(str(j), str(o), str(out or "")) for j, o, out in rows if o != "SKIPPED"]


def _runner_errors(session: Path) -> list[str]:
    """Mutants whose run the fork server could not do as a fresh process would (its marker)."""
    from mutation_forkserver import MARKER  # type: ignore[import-not-found]

    bad = [job for job, _, output in _results(session) if MARKER in output]
    if bad:
        print(f"\nRUNNER ERROR in {len(bad)} mutant(s) (their verdicts do not count): {bad}", file=sys.stderr)
    return bad


def _summary(session: Path, what: str, seconds: float, ran_now: int | None = None) -> str:
    rows = sqlite3.connect(str(session)).execute(
        "select coalesce(test_outcome, worker_outcome), count(*) from work_results group by 1").fetchall()
    counts = {str(k): v for k, v in rows}
    killed, survived = counts.get("KILLED", 0), counts.get("SURVIVED", 0)
    ran = sum(v for k, v in counts.items() if k != "SKIPPED") if ran_now is None else ran_now
    per = f", {seconds / ran:.1f} s a mutant" if ran else ""
    lines = [f"cosmic-ray: {what}; {seconds / 60:.1f} min for {ran} mutants{per}", "",
             "| outcome | mutants |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(counts.items())]
    if killed + survived:
        lines.append(f"\nscore: {killed}/{killed + survived} = {100 * killed / (killed + survived):.1f}% killed")
    return "\n".join(lines)


def _survivors(report: str) -> list[str]:
    """The diff of every surviving mutant (cr-report's blocks whose outcome is SURVIVED)."""
    blocks = report.split("\n[job-id]")
    return [b.strip() for b in blocks if "test outcome: TestOutcome.SURVIVED" in b]


def _compare(args: argparse.Namespace, work: Path, commit: str) -> int:
    """Each sampled mutant through cosmic-ray's ``mutate_and_test`` with both runners (the one that
    goes first alternates, so a busy machine slows both alike): the verdicts must be the same."""
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_db import WorkDB, use_db

    with ForkServer(work) as server:
        commands = {"fresh": test_command("fresh", args.flavour, module=args.module),
                    "fork": test_command("fork", args.flavour, server.socket, args.module)}
        session, sampled = _prepare(args, work, commands["fork"])
        with use_db(str(session), WorkDB.Mode.open) as db:
            items = sorted(db.pending_work_items, key=lambda item: item.job_id)
        print(f"fork server against fresh processes: {args.module} on commit {commit}{sampled}\n")
        print("| mutant | operator | line | fresh | s | fork | s |")
        print("|---|---|---:|---|---:|---|---:|")
        rows: list[dict[str, Any]] = []
        cwd = os.getcwd()
        os.chdir(work)  # cosmic-ray mutates module-path relative to here
        try:
            for n, item in enumerate(items):
                row: dict[str, Any] = {}
                for runner in (("fresh", "fork") if n % 2 == 0 else ("fork", "fresh")):
                    start = time.perf_counter()
                    result = mutate_and_test(item.mutations, commands[runner], args.timeout)
                    row[runner] = (_verdict(result), time.perf_counter() - start, result.output or "")
                mutation = item.mutations[0]
                rows.append(row)
                print(f"| {item.job_id[:8]} | {mutation.operator_name}#{mutation.occurrence} | "
                      f"{mutation.start_pos[0]} | {row['fresh'][0]} | {row['fresh'][1]:.1f} | "
                      f"{row['fork'][0]} | {row['fork'][1]:.1f} |", flush=True)
        finally:
            os.chdir(cwd)
    from mutation_forkserver import MARKER

    differ = [r for r in rows if r["fresh"][0] != r["fork"][0]]
    errors = [r for r in rows if MARKER in r["fork"][2]]
    for runner in ("fresh", "fork"):
        times = [r[runner][1] for r in rows]
        print(f"\n{runner}: {sum(times) / len(times):.1f} s a mutant on average "
              f"({sum(times) / 60:.1f} min for {len(times)})", end="")
    print(f"\n\n{len(rows) - len(differ)}/{len(rows)} mutants with the same verdict; runner errors: {len(errors)}")
    for r in differ:
        print("\nDIFFERENT VERDICT:", {k: (v[0], v[2][-2000:]) for k, v in r.items()})
    return 1 if differ or errors or not rows else 0


def _verdict(result: Any) -> str:
    outcome = result.test_outcome or result.worker_outcome
    verdict = str(getattr(outcome, "value", outcome)).lower()
    return f"{verdict} (timeout)" if result.output == "timeout" else verdict


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
