"""A run: every file parsed and its classes indexed (first pass), then each file rewritten and
reported (second pass); one file that cannot be processed is reported and the others go on."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from toggleshim._migrate._assumptions import ASSUMPTIONS
from toggleshim._migrate._files import _diff, _write_atomically
from toggleshim._migrate._imports import _add_import
from toggleshim._migrate._program import _Program
from toggleshim._migrate._rules import _Migrator, _Span


@dataclass
class _FileResult:
    path: str
    old: bytes
    new: bytes
    spans: list[_Span] = field(default_factory=list)
    other: list[tuple[int, str]] = field(default_factory=list)  # uses of toggle_optimizer's result
    plain: int = 0  # blocks written `with R.toggle_optimizer(X)`: they rely on the assumption (docs)
    outside: set[str] = field(default_factory=set)  # bases from outside the run of their classes
    # overrides of toggle_optimizer that drop the toggle a `with self.toggle_optimizer(...)` of this
    # file uses: ((the override's file, the line of its super() call, its class), the block's line)
    dropped: list[tuple[tuple[str, int, str], int]] = field(default_factory=list)


@dataclass
class _Parsed:
    """One file of the run, parsed (kept from the first pass, where every file's classes are indexed,
    to the second, where each is rewritten)."""

    path: str
    source: bytes
    module: cst.Module
    positions: Any


def _parse(source: bytes, path: str) -> _Parsed:
    """Parse one file's bytes (raises ``cst.ParserSyntaxError`` when it does not parse)."""
    module = cst.parse_module(source)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    return _Parsed(path, source, module, positions)


def _migrate_parsed(parsed: _Parsed, program: _Program, assume: frozenset[str] = frozenset()) -> _FileResult:
    migrator = _Migrator(parsed.module, parsed.positions, program, assume)
    new = migrator.run()
    if migrator.migrated:
        new = _add_import(new, parsed.path, used=bool(migrator.through))
    spans = sorted(migrator.spans, key=lambda s: s.line)
    data = new.bytes if new is not parsed.module else parsed.source
    result = _FileResult(parsed.path, parsed.source, data, spans, sorted(migrator.other))
    result.plain, result.outside = migrator.plain, migrator.outside
    result.dropped = [((c.path, c.drops, c.name), line) for line, cls in migrator.blocks for c in program.dropping(cls)
                      if c.drops is not None]
    return result


def migrate_source(source: bytes, path: str = "<string>", assume: frozenset[str] = frozenset()) -> _FileResult:
    """Migrate one file's bytes on its own: the run is this file (raises ``cst.ParserSyntaxError``
    when it does not parse). ``assume``: names of ``ASSUMPTIONS`` the user opted into."""
    unknown = set(assume) - set(ASSUMPTIONS)
    if unknown:
        raise ValueError(f"unknown assumption(s) {sorted(unknown)}; known: {sorted(ASSUMPTIONS)}")
    parsed = _parse(source, path)
    program = _Program()
    program.add(path, parsed.module, parsed.positions)
    return _migrate_parsed(parsed, program, frozenset(assume))


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _syntax_error(source: bytes, path: str, exc: cst.ParserSyntaxError) -> str:
    """``:line:column: skipped: cannot parse: why``, in Python's words where Python agrees it does not parse."""
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as py:
        return f":{py.lineno}:{py.offset}: skipped: cannot parse: {py.msg}"
    except (ValueError, RecursionError, MemoryError):  # null bytes; too deep for Python's own parser
        pass
    return f":{exc.raw_line}:{exc.raw_column + 1}: skipped: cannot parse: {exc.message}"


class _Skipped(Exception):
    """One file could not be processed: ``where`` (``:line:col`` or empty) and why; the run goes on."""

    def __init__(self, why: str, where: str = "") -> None:
        super().__init__(why)
        self.why, self.where = why, where


@contextlib.contextmanager
def _skipping(source: bytes, path: str) -> Iterator[None]:
    """Any failure to parse or analyse one file becomes a ``_Skipped`` with the reason."""
    try:
        yield
    except cst.ParserSyntaxError as exc:
        where, _, why = _syntax_error(source, path, exc).partition(": skipped: ")
        raise _Skipped(why, where) from exc
    except (UnicodeDecodeError, SyntaxError) as exc:  # a bad coding cookie or undecodable bytes
        raise _Skipped(f"cannot decode: {exc}") from exc
    except RecursionError as exc:  # valid Python nested deeper than LibCST's recursive walk goes
        raise _Skipped(
            "LibCST cannot handle this file: an expression or block nested too deeply for its recursive walk "
            f"(RecursionError: {exc})"
        ) from exc
    except Exception as exc:  # whatever else stops the analysis of this file must not stop the run
        raise _Skipped(f"cannot analyse: {type(exc).__name__}: {exc}") from exc


def _load(path: str, program: _Program) -> _Parsed:
    """Read and parse one file and index its classes in ``program``; any failure is a ``_Skipped``."""
    try:
        source = _read(path)
    except OSError as exc:
        raise _Skipped(f"cannot read: {exc.strerror or exc}") from exc
    with _skipping(source, path):
        parsed = _parse(source, path)
        program.add(path, parsed.module, parsed.positions)
    return parsed


def _analyse(parsed: _Parsed, program: _Program, assume: frozenset[str]) -> _FileResult:
    with _skipping(parsed.source, parsed.path):
        return _migrate_parsed(parsed, program, assume)
    raise AssertionError("unreachable")  # for mypy: _skipping re-raises every exception


# What a `with R.toggle_optimizer(X)` block relies on and the run cannot see (docs/migrate.md,
# "Overrides"): said once a run, in one short line, or in full with --verbose
_ASSUMED = "toggleshim migrate: assumed: no toggle_optimizer outside these files returns None (--verbose: more)\n"
_ASSUMED_IN_FULL = (
    "toggleshim migrate: assumed: no class outside these files{bases} overrides toggle_optimizer without "
    "returning super().toggle_optimizer(...)'s result (a subclass defined elsewhere{skipped}); where one does, "
    'rewrite its blocks as `with toggleshim.toggle(self, opt):` (docs/migrate.md, "Overrides")\n'
)


# An override of toggle_optimizer that calls super() and drops its result, with a block on it (--check)
_DROPPED = (
    "{where}:{line}: `{name}.toggle_optimizer` calls `super().toggle_optimizer(...)` and drops its result: "
    "`with self.toggle_optimizer(...)` at {block} gets None ('NoneType' object does not support the context "
    "manager protocol); return it (`return super().toggle_optimizer(optimizer, **kwargs)`, or keep it and "
    "return it last), or write the block as `with toggleshim.toggle(self, opt):`\n"
)


def _run(files: list[str], mode: str, assume: frozenset[str] = frozenset(), verbose: bool = False) -> int:
    """Process every file (one that cannot be processed is reported, the others go on); exit code.
    Two passes: every file's classes are indexed first (an override may be in any file of the run),
    then each file is rewritten."""
    failed = findings = changed = migrated = checked = plain = 0
    outside: set[str] = set()
    dropping: dict[tuple[str, int, str], tuple[str, int]] = {}  # override (path, line, class) -> a block on it
    program = _Program()
    loaded: list[_Parsed | _Skipped] = []
    for path in files:
        try:
            loaded.append(_load(path, program))
        except _Skipped as exc:
            loaded.append(exc)
    for path, item in zip(files, loaded):
        try:
            if isinstance(item, _Skipped):
                raise item
            result = _analyse(item, program, assume)
        except _Skipped as exc:
            sys.stderr.write(f"{path}{exc.where}: skipped: {exc.why}\n")
            failed += 1
            continue
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
            sys.stdout.flush()  # a closed pipe shows here, not at exit
            continue
        for span in result.spans:
            if span.reason is not None:
                sys.stderr.write(f"{path}:{span.line}: not migrated: {span.reason}\n")
        for line, reason in result.other:
            sys.stderr.write(f"{path}:{line}: not migrated: {reason}\n")
        n = sum(1 for s in result.spans if s.reason is None)
        if result.new == result.old:
            continue
        if mode == "write":
            try:
                _write_atomically(path, result.new)
            except OSError as exc:
                sys.stderr.write(f"{path}: skipped: cannot write: {exc.strerror or exc} (left unchanged)\n")
                failed += 1
                continue
            sys.stderr.write(f"{path}: migrated {n} span{'s' * (n != 1)}\n")
        else:
            sys.stdout.write(_diff(path, result.old, result.new))
            sys.stdout.flush()  # a closed pipe shows here, not at exit
        changed += 1  # only what was written (or shown)
        migrated += n
        plain += result.plain
        outside |= result.outside
    total = f"{len(files)} file{'s' * (len(files) != 1)}"
    unread = f"{failed} could not be processed (see above)" if failed else ""
    if mode == "check":
        for (where, line, name), (block_path, block_line) in sorted(dropping.items()):
            sys.stdout.write(_DROPPED.format(where=where, line=line, name=name, block=f"{block_path}:{block_line}"))
        if checked == 0:
            sys.stderr.write(f"toggleshim migrate --check: nothing checked: {failed} of {total} could not be read\n")
        else:
            n = len(dropping)
            drops = f"; {n} override{'s' * (n != 1)} of toggle_optimizer dropping a block's toggle" if n else ""
            sys.stderr.write(
                f"toggleshim migrate --check: {findings} statement toggle{'s' * (findings != 1)} not exception-safe "
                f"in {checked} file{'s' * (checked != 1)} checked{drops}" + (f"; {unread}" if unread else "") + "\n"
            )
        return 1 if findings or dropping or failed else 0
    if plain and not verbose:
        sys.stderr.write(_ASSUMED)
    elif plain:
        named = sorted(outside)
        listed = ", ".join(named[:3]) + (", ..." if len(named) > 3 else "")
        bases = f" (nor the bases from outside: {listed})" if named else ""
        skipped = ", or in a file that could not be processed" if failed else ""
        sys.stderr.write(_ASSUMED_IN_FULL.format(bases=bases, skipped=skipped))
    verb = "rewrote" if mode == "write" else "would rewrite"
    sys.stderr.write(
        f"toggleshim migrate: {verb} {changed} of {total} ({migrated} span{'s' * (migrated != 1)})"
        + (f"; {unread}" if unread else "")
        + "\n"
    )
    return 1 if failed else 0
