"""Measure how often `toggleshim migrate` reaches the clean block on a corpus of real public modules.

    python scripts/migrate_corpus.py [--list scripts/migrate_corpus.txt] [--corpus /tmp/corpus]
                                     [--diffs DIR] [--timeout 120]
    python scripts/migrate_corpus.py --urls [--list scripts/migrate_corpus.txt]

The list file has one ``owner/name commit path`` per line (``#`` starts a comment): a public GitHub
repository, the full 40-hex commit and the file's path in it. The files themselves are third-party
code and are not in this repository; they are read from the corpus directory, laid out as

    <corpus>/<owner>/<name>/<path>        (the file at the listed commit, byte for byte)

To fill it, either download each file from its raw URL at the commit (``--urls`` prints one
``URL<TAB>destination`` per line, so ``python scripts/migrate_corpus.py --urls | while IFS=$'\t'
read url dest; do mkdir -p "$(dirname "$dest")"; curl -fsSL "$url" -o "$dest"; done`` does it), or
take them from clones: ``git -C <clone> show <commit>:<path> > <corpus>/<owner>/<name>/<path>``.

For each file, ``python -m toggleshim migrate --diff FILE`` runs in a fresh subprocess (the
interpreter running this script, so the toggleshim it imports) with the default rules, with each
``--assume`` alone, and with both. Each file is its own run: overrides are looked for within that
file only. From the diff and the messages it counts per file: statement toggles found (an
independent count from Python's ``ast``: a ``R.toggle_optimizer(...)`` call used as a statement, not
``super().toggle_optimizer(...)`` inside an override), rewritten spans, and among them the clean
form (``with R.toggle_optimizer(X):``, no flag), ``zero_grad=False``, ``step=False`` (both flags
count in both columns, and again in "both"), the ``toggleshim.toggle(...)`` form, and refusals with
their reasons. A statement toggle neither rewritten nor refused is reported as unaccounted. One
file failing (missing, unreadable, migrate crashing or timing out) is reported in the table and the
others are measured. The Markdown goes to stdout.

The round trip, per file and mode: ``migrate --write`` on a copy of the file (in a temporary
directory), then ``migrate --to-lightning --write`` on it; counted: the blocks written, the blocks
rewritten back into Lightning's statements, and whether ``toggleshim`` is left in the file.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES: list[tuple[str, list[str]]] = [
    ("default", []),
    ("torch2-defaults", ["--assume", "torch2-defaults"]),
    ("forward-reads-no-grad", ["--assume", "forward-reads-no-grad"]),
    ("both", ["--assume", "torch2-defaults", "--assume", "forward-reads-no-grad"]),
]
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_WITH = re.compile(r"^\s*with\s")


@dataclass(frozen=True)
class Entry:
    """One corpus file: where it comes from, and where it is read."""

    repo: str
    commit: str
    path: str

    def local(self, corpus: Path) -> Path:
        return corpus / self.repo / self.path

    def url(self) -> str:
        return f"https://raw.githubusercontent.com/{self.repo}/{self.commit}/{self.path}"

    def label(self) -> str:
        return f"{self.repo} `{self.path}`"


@dataclass
class Count:
    """What one migrate run made of one file."""

    rewritten: int = 0
    clean: int = 0
    zero_grad_false: int = 0
    step_false: int = 0
    both_false: int = 0
    toggle_form: int = 0
    refused: list[str] = field(default_factory=list)  # "line: reason"
    error: str | None = None
    diff: str = ""  # migrate's stdout, kept for --diffs


def read_list(path: Path) -> list[Entry]:
    """The entries of a list file; a malformed line is an error naming it (nothing is run)."""
    entries = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or not _REPO.fullmatch(parts[0]) or not _COMMIT.fullmatch(parts[1]):
            raise ValueError(f"{path}:{number}: expected `owner/name <40-hex commit> path`, got {raw!r}")
        if parts[2].startswith("/") or ".." in Path(parts[2]).parts:
            raise ValueError(f"{path}:{number}: the path must be relative to the repository: {parts[2]!r}")
        entries.append(Entry(*parts))
    return entries


def statement_toggles(source: str) -> int:
    """``R.toggle_optimizer(...)`` calls used as statements, as migrate's spans start (ast, independent of migrate)."""
    tree = ast.parse(source)
    overrides: set[int] = set()  # the statements inside a method named toggle_optimizer
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "toggle_optimizer":
            overrides.update(id(inner) for inner in ast.walk(node))
    found = 0
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if not (isinstance(func, ast.Attribute) and func.attr == "toggle_optimizer"):
            continue
        receiver = func.value
        is_super = (
            isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super"
        )
        if is_super and id(node) in overrides:
            continue  # an override's own toggle: not a statement toggle of the user's
        found += 1
    return found


def with_headers(diff: str) -> list[str]:
    """The ``with`` headers migrate added, each joined into one line (a header may span lines)."""
    headers: list[str] = []
    current: list[str] | None = None
    for line in diff.splitlines():
        if not line.startswith("+") or line.startswith("+++"):
            current = None
            continue
        text = line[1:]
        if current is None and _WITH.match(text) and ("toggle_optimizer(" in text or "toggleshim.toggle(" in text):
            current = [text.strip()]
        elif current is not None:
            current.append(text.strip())
        else:
            continue
        if current[-1].endswith(":"):
            headers.append(" ".join(current))
            current = None
    return headers


def run_migrate(file: Path, extra: list[str], timeout: float) -> Count:
    """One ``toggleshim migrate --diff`` in a fresh subprocess, counted."""
    count = Count()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "toggleshim", "migrate", "--diff", *extra, str(file)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        count.error = f"migrate timed out after {timeout:g} s"
        return count
    prefix = f"{file}:"
    for line in proc.stderr.splitlines():
        if line.startswith(prefix) and ": not migrated: " in line:
            where, _, reason = line[len(prefix) :].partition(": not migrated: ")
            count.refused.append(f"{where}: {reason}")
        elif line.startswith(prefix) and ": skipped: " in line:
            count.error = line[len(str(file)) :].lstrip(":").strip()
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and count.error is None):
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no message)"]
        count.error = f"migrate exited {proc.returncode}: {tail[0]}"
    for header in with_headers(proc.stdout):
        count.rewritten += 1
        zero_grad = "zero_grad=False" in header
        step = "step=False" in header
        count.zero_grad_false += zero_grad
        count.step_false += step
        count.both_false += zero_grad and step
        if "toggleshim.toggle(" in header:
            count.toggle_form += 1
        elif not zero_grad and not step:
            count.clean += 1
    count.diff = proc.stdout
    return count


@dataclass
class Trip:
    """One file there and back: ``--write``, then ``--to-lightning --write``, on a copy."""

    there: int = 0  # blocks written
    back: int = 0  # blocks rewritten back into statements
    left: bool = False  # `toggleshim` is still in the file afterwards
    error: str | None = None


_THERE = re.compile(r": migrated (\d+) spans?$", re.MULTILINE)
_BACK = re.compile(r": rewrote (\d+) blocks? into Lightning's statements", re.MULTILINE)


def round_trip(file: Path, extra: list[str], timeout: float) -> Trip:
    """The file migrated forward (``extra``: the mode's options) and back, on a copy of it."""
    trip = Trip()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / file.name
        shutil.copyfile(file, copy)
        for args, pattern in ((["--write", *extra], _THERE), (["--to-lightning", "--write"], _BACK)):
            try:
                proc = subprocess.run([sys.executable, "-m", "toggleshim", "migrate", *args, copy.name], cwd=tmp,
                                      capture_output=True, text=True, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                trip.error = f"{' '.join(args)} timed out after {timeout:g} s"
                return trip
            if proc.returncode != 0:
                tail = proc.stderr.strip().splitlines()[-1:] or ["(no message)"]
                trip.error = f"{' '.join(args)} exited {proc.returncode}: {tail[0]}"
                return trip
            found = sum(int(n) for n in pattern.findall(proc.stderr))
            trip.there, trip.back = (found, trip.back) if pattern is _THERE else (trip.there, found)
        text = copy.read_text(encoding="utf-8")
        try:
            ast.parse(text)
        except SyntaxError as exc:
            trip.error = f"the file back does not parse: {exc}"
        trip.left = "toggleshim" in text
    return trip


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def measure(entries: list[Entry], corpus: Path, timeout: float, diffs: Path | None) -> str:
    """Run every file in every mode and render the Markdown report."""
    found: dict[Entry, int | str] = {}
    counts: dict[tuple[Entry, str], Count] = {}
    trips: dict[tuple[Entry, str], Trip] = {}
    for entry in entries:
        file = entry.local(corpus)
        try:
            found[entry] = statement_toggles(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError) as exc:
            found[entry] = f"cannot read: {type(exc).__name__}: {exc}"
            continue
        for mode, extra in MODES:
            try:
                count = run_migrate(file, extra, timeout)
            except OSError as exc:  # the interpreter could not be started: say so for this file, go on
                count = Count(error=f"cannot run migrate: {exc}")
            counts[entry, mode] = count
            try:
                trips[entry, mode] = round_trip(file, extra, timeout)
            except OSError as exc:
                trips[entry, mode] = Trip(error=f"cannot run migrate: {exc}")
            if diffs is not None and count.diff:
                out = diffs / mode / entry.repo / (entry.path + ".diff")
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(count.diff, encoding="utf-8")

    lines = ["| mode | files | statement toggles | rewritten | clean | `zero_grad=False` | `step=False` | both flags "
             "| `toggleshim.toggle` | refused | unaccounted | clean / toggles | clean / rewritten |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    measured = [e for e in entries if isinstance(found[e], int)]
    for mode, _ in MODES:
        ok = [e for e in measured if counts[e, mode].error is None]
        total = sum(int(found[e]) for e in ok)
        cs = [counts[e, mode] for e in ok]
        rewritten = sum(c.rewritten for c in cs)
        clean = sum(c.clean for c in cs)
        refused = sum(len(c.refused) for c in cs)
        lines.append(
            f"| {mode} | {len(ok)} | {total} | {rewritten} | {clean} | {sum(c.zero_grad_false for c in cs)} "
            f"| {sum(c.step_false for c in cs)} | {sum(c.both_false for c in cs)} | {sum(c.toggle_form for c in cs)} "
            f"| {refused} | {total - rewritten - refused} | {_pct(clean, total)} | {_pct(clean, rewritten)} |"
        )
    lines += ["", "Per file: statement toggles; then, per mode, clean / `zero_grad=False` / `step=False` "
              "(a span with both flags counts in both) / refused.", "",
              "| file | toggles | default | torch2-defaults | forward-reads-no-grad | both |",
              "|---|---:|---|---|---|---|"]  # fmt: skip
    notes: list[str] = []
    for entry in entries:
        if not isinstance(found[entry], int):
            lines.append(f"| {entry.label()} | n/a | {found[entry]} | | | |")
            continue
        cells = []
        for mode, _ in MODES:
            c = counts[entry, mode]
            if c.error is not None:
                cells.append(f"error: {c.error}")
                continue
            cells.append(f"{c.clean} / {c.zero_grad_false} / {c.step_false} / {len(c.refused)}")
            if c.toggle_form:
                notes.append(f"- {entry.label()} ({mode}): {c.toggle_form} `toggleshim.toggle` form")
            left = int(found[entry]) - c.rewritten - len(c.refused)
            if left:
                notes.append(f"- {entry.label()} ({mode}): {left} statement toggle(s) neither rewritten nor refused")
        lines.append(f"| {entry.label()} | {found[entry]} | " + " | ".join(cells) + " |")
    refusals: dict[str, list[str]] = {}
    for entry in measured:
        for mode, _ in MODES:
            for refusal in counts[entry, mode].refused:
                refusals.setdefault(f"{entry.label()}:{refusal}", []).append(mode)
    if refusals:
        lines += ["", "Refusals (file:line: reason — modes):", ""]
        lines += [f"- {what} — {', '.join(modes)}" for what, modes in refusals.items()]
    lines += ["", "Round trip: `migrate --write`, then `migrate --to-lightning --write`, on a copy of each file.", "",
              "| mode | files | blocks written | blocks back | files with `toggleshim` left | errors |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for mode, _ in MODES:
        done = [trips[e, mode] for e in measured]
        ok = [trip for trip in done if trip.error is None]
        lines.append(f"| {mode} | {len(ok)} | {sum(t.there for t in ok)} | {sum(t.back for t in ok)} "
                     f"| {sum(t.left for t in ok)} | {len(done) - len(ok)} |")
        notes += [f"- {e.label()} ({mode}), round trip: {trips[e, mode].error}" for e in measured
                  if trips[e, mode].error is not None]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", type=Path, default=ROOT / "scripts" / "migrate_corpus.txt")
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/corpus"))
    parser.add_argument("--diffs", type=Path, help="also write each diff to DIR/<mode>/<owner>/<name>/<path>.diff")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for one migrate run")
    parser.add_argument("--urls", action="store_true", help="print `raw URL<TAB>destination` per file and stop")
    args = parser.parse_args(argv)
    try:
        entries = read_list(args.list)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if not entries:
        parser.error(f"{args.list}: no entries")
    if args.urls:
        for entry in entries:
            print(f"{entry.url()}\t{entry.local(args.corpus)}")
        return 0
    sys.stdout.write(measure(entries, args.corpus, args.timeout, args.diffs))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # `--urls | head`: the reader left; end quietly, as a shell tool would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
