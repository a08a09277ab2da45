"""A run of the command over its files, in either direction: the two passes (every file's classes
indexed, then each file rewritten; a file that cannot be processed is reported and the others go
on), what is printed (diffs and ``--check`` findings on stdout, the rest on stderr) and the exit
code."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

from toggleshim._migrate._files import _diff, _write_atomically
from toggleshim._migrate._program import _Program
from toggleshim._migrate._run import _analyse, _analyse_back, _BackResult, _finish_back, _load, _Parsed, _Skipped

_R = TypeVar("_R")

# What a `with R.toggle_optimizer(X)` block relies on and the run cannot see (docs/migrate.md,
# "Overrides"): said once a run, in one short line, or in full with --verbose
_ASSUMED = "toggleshim migrate: assumed: no toggle_optimizer outside these files returns None (--verbose: more)\n"
_ASSUMED_IN_FULL = (
    "toggleshim migrate: assumed: no class outside these files{bases} overrides toggle_optimizer without "
    "returning super().toggle_optimizer(...)'s result (a subclass defined elsewhere{skipped}); where one does, "
    'rewrite its blocks as `with toggleshim.toggle(self, opt):` (docs/migrate.md, "Overrides")\n'
)
# The way back relies on the same (docs/migrate.md, "Back to Lightning")
_ASSUMED_BACK = "toggleshim migrate: assumed: no toggle_optimizer outside these files is overridden (--verbose: more)\n"
_ASSUMED_BACK_IN_FULL = (
    "toggleshim migrate: assumed: no class outside these files{bases} overrides toggle_optimizer (a subclass "
    "defined elsewhere{skipped}): a `with self.toggle_optimizer(opt):` block uses what it returns and passes it the "
    "block's flags, Lightning's statement neither; where one does, check its blocks by hand "
    '(docs/migrate.md, "Back to Lightning")\n'
)

# An override of toggle_optimizer that calls super() and drops its result, with a block on it (--check)
_DROPPED = (
    "{where}:{line}: `{name}.toggle_optimizer` calls `super().toggle_optimizer(...)` and drops its result: "
    "`with self.toggle_optimizer(...)` at {block} gets None ('NoneType' object does not support the context "
    "manager protocol); return it (`return super().toggle_optimizer(optimizer, **kwargs)`, or keep it and "
    "return it last), or write the block as `with toggleshim.toggle(self, opt):`\n"
)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


class _Run:
    """One run over its files: the first pass at construction, then each file analysed in turn."""

    def __init__(self, files: list[str], mode: str) -> None:
        self.files, self.mode = files, mode
        self.failed = 0
        self.program = _Program()
        self.loaded: list[_Parsed | _Skipped] = []
        for path in files:
            try:
                self.loaded.append(_load(path, self.program))
            except _Skipped as exc:
                self.loaded.append(exc)

    def analysed(self, analyse: Callable[[_Parsed, _Program], _R]) -> Iterator[tuple[str, _R]]:
        """(path, what ``analyse`` made of it) for every file that could be processed; the others
        are reported, in their place."""
        for path, item in zip(self.files, self.loaded):
            try:
                if isinstance(item, _Skipped):
                    raise item
                result = analyse(item, self.program)
            except _Skipped as exc:
                sys.stderr.write(f"{path}{exc.where}: skipped: {exc.why}\n")
                self.failed += 1
                continue
            yield path, result

    def emit(self, path: str, old: bytes, new: bytes, done: str) -> bool:
        """Show the diff of a changed file, or write it and say ``path: done``; False when its write
        failed (reported; the file is left unchanged)."""
        if self.mode == "write":
            try:
                _write_atomically(path, new)
            except OSError as exc:
                sys.stderr.write(f"{path}: skipped: cannot write: {exc.strerror or exc} (left unchanged)\n")
                self.failed += 1
                return False
            sys.stderr.write(f"{path}: {done}\n")
        else:
            sys.stdout.write(_diff(path, old, new))
            sys.stdout.flush()  # a closed pipe shows here, not at exit
        return True

    @property
    def unread(self) -> str:
        return f"; {self.failed} could not be processed (see above)" if self.failed else ""

    def total(self) -> str:
        return _plural(len(self.files), "file")

    def assumed(self, outside: set[str], short: str, in_full: str, verbose: bool) -> None:
        """The assumption about classes outside the run, once: short, or in full (``verbose``)."""
        if not verbose:
            sys.stderr.write(short)
            return
        named = sorted(outside)
        listed = ", ".join(named[:3]) + (", ..." if len(named) > 3 else "")
        bases = f" (nor the bases from outside: {listed})" if named else ""
        skipped = ", or in a file that could not be processed" if self.failed else ""
        sys.stderr.write(in_full.format(bases=bases, skipped=skipped))


def _migrate_files(files: list[str], mode: str, assume: frozenset[str] = frozenset(), verbose: bool = False) -> int:
    """Statement toggles into blocks: every file of the run; the exit code."""
    run = _Run(files, mode)
    findings = changed = migrated = checked = plain = doubled = 0
    outside: set[str] = set()
    dropping: dict[tuple[str, int, str], tuple[str, int]] = {}  # override (path, line, class) -> a block on it
    for path, result in run.analysed(lambda parsed, program: _analyse(parsed, program, assume)):
        if mode == "check":
            checked += 1
            for span in result.spans:
                if span.safe:
                    continue
                findings += 1
                fix = "`toggleshim migrate` rewrites it" if span.reason is None else f"not migrated: {span.reason}"
                sys.stdout.write(
                    f"{path}:{span.line}: `{span.text}` as a statement: an exception before its untoggle "
                    f"leaves the optimizers toggled; {fix}\n"
                )
            for override, line in result.dropped:
                dropping.setdefault(override, (path, line))
            for inside in result.steps_inside:
                doubled += 1
                when = f" (step={inside.when}: when `{inside.when}` is true)" if inside.when else ""
                sys.stdout.write(
                    f"{path}:{inside.line}: `{inside.step}` inside `with {inside.block}:` (line {inside.block_line}), "
                    f"which steps on exit{when}: the optimizer would step twice (toggleshim raises a RuntimeError at "
                    "the block's exit instead); pass step=False to keep this call, or drop it and let the block step\n"
                )
            sys.stdout.flush()  # a closed pipe shows here, not at exit
            continue
        for span in result.spans:
            if span.reason is not None:
                sys.stderr.write(f"{path}:{span.line}: not migrated: {span.reason}\n")
        for line, reason in result.other:
            sys.stderr.write(f"{path}:{line}: not migrated: {reason}\n")
        n = sum(1 for s in result.spans if s.reason is None)
        if result.new == result.old or not run.emit(path, result.old, result.new, f"migrated {_plural(n, 'span')}"):
            continue
        changed += 1  # only what was written (or shown)
        migrated += n
        plain += result.plain
        outside |= result.outside
    if mode == "check":
        for (where, line, name), (block_path, block_line) in sorted(dropping.items()):
            sys.stdout.write(_DROPPED.format(where=where, line=line, name=name, block=f"{block_path}:{block_line}"))
        if checked == 0:
            sys.stderr.write(f"toggleshim migrate --check: nothing checked: {run.failed} of {run.total()} could not "
                             "be read\n")
        else:
            n = len(dropping)
            drops = f"; {_plural(n, 'override')} of toggle_optimizer dropping a block's toggle" if n else ""
            steps = f"; {_plural(doubled, 'step')} inside a block that steps on exit" if doubled else ""
            sys.stderr.write(
                f"toggleshim migrate --check: {_plural(findings, 'statement toggle')} not exception-safe "
                f"in {_plural(checked, 'file')} checked{drops}{steps}{run.unread}\n"
            )
        return 1 if findings or dropping or doubled or run.failed else 0
    if plain:
        run.assumed(outside, _ASSUMED, _ASSUMED_IN_FULL, verbose)
    verb = "rewrote" if mode == "write" else "would rewrite"
    spans = _plural(migrated, "span")
    sys.stderr.write(f"toggleshim migrate: {verb} {changed} of {run.total()} ({spans}){run.unread}\n")
    return 1 if run.failed else 0


def _unmigrate_files(files: list[str], mode: str, verbose: bool = False) -> int:
    """``--to-lightning``: blocks back into Lightning's statements, every file of the run; the exit
    code. The imports of toggleshim go only when nothing left in the run needs toggleshim."""
    run = _Run(files, mode)
    results = [result for _, result in run.analysed(_analyse_back)]
    left = sum(1 for r in results for b in r.blocks if b.reason is not None) + sum(len(r.other) for r in results)
    # a file that could not be processed may need toggleshim too: then every import stays
    _finish_back(results, drop=not left and not run.failed)
    if mode == "check":
        return _check_back(run, results)
    changed = rewritten = 0
    plain = False
    outside: set[str] = set()
    for result in results:
        for block in result.blocks:
            if block.reason is not None:
                sys.stderr.write(f"{result.path}:{block.line}: not rewritten: {block.reason}\n")
        for line, what in result.other:
            sys.stderr.write(f"{result.path}:{line}: needs toggleshim: {what}\n")
        if result.new == result.old:
            continue
        done = [f"rewrote {_plural(result.rewritten, 'block')} into Lightning's statements"] * bool(result.rewritten)
        done += ["dropped its import of toggleshim"] * (result.imports_left < len(result.imports))
        if run.emit(result.path, result.old, result.new, "; ".join(done)):
            changed += 1
            rewritten += result.rewritten
            plain = plain or result.plain
            outside |= result.outside
    if plain:
        run.assumed(outside, _ASSUMED_BACK, _ASSUMED_BACK_IN_FULL, verbose)
    verb = "rewrote" if mode == "write" else "would rewrite"
    rest = f"; {left} left as they are (see above), so every import of toggleshim stays" if left else ""
    if run.failed and not left and any(r.imports for r in results):
        rest = "; every import of toggleshim stays (a file that could not be processed may need it)"
    sys.stderr.write(
        f"toggleshim migrate --to-lightning: {verb} {changed} of {run.total()} ({_plural(rewritten, 'block')})"
        f"{rest}{run.unread}\n"
    )
    return 1 if run.failed else 0


def _check_back(run: _Run, results: list[_BackResult]) -> int:
    """``--to-lightning --check``: every use of toggleshim, with what ``--to-lightning`` does to it."""
    findings = 0
    for result in results:
        uses = [(b.line, f"`with {b.text}:` needs toggleshim; " + (
            "`toggleshim migrate --to-lightning` rewrites it" if b.reason is None else f"not rewritten: {b.reason}"
        )) for b in result.blocks]
        uses += [(line, f"needs toggleshim: {what}") for line, what in result.other]
        fate = "`toggleshim migrate --to-lightning` drops it" if not result.imports_left else "it stays"
        uses += [(line, f"imports toggleshim; {fate}") for line in result.imports]
        for line, what in sorted(uses):
            sys.stdout.write(f"{result.path}:{line}: {what}\n")
        findings += len(uses)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    if not results:
        sys.stderr.write(f"toggleshim migrate --to-lightning --check: nothing checked: {run.failed} of {run.total()} "
                         "could not be read\n")
    else:
        sys.stderr.write(f"toggleshim migrate --to-lightning --check: {_plural(findings, 'use')} of toggleshim in "
                         f"{_plural(len(results), 'file')} checked{run.unread}\n")
    return 1 if findings or run.failed else 0
