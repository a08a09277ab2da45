"""The files of a run, one by one: each read and parsed and its classes indexed (the first pass),
then rewritten, forward or back (the second); whatever stops one file is that file's ``_Skipped``
(the run goes on: ``_command``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from toggleshim._migrate._assumptions import ASSUMPTIONS
from toggleshim._migrate._back import _Block, _StepInside, _Unmigrator, steps_inside
from toggleshim._migrate._imports import _add_import, _add_stdlib_import, _drop_imports, _names_used, _of_toggleshim
from toggleshim._migrate._program import _Program
from toggleshim._migrate._rules import _Migrator, _Span
from toggleshim._migrate._syntax import _nodes


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
    steps_inside: list[_StepInside] = field(default_factory=list)  # a step inside a block that steps (--check)


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
    result.steps_inside = steps_inside(parsed.module, parsed.positions, program)
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


def _analyse_back(parsed: _Parsed, program: _Program) -> _BackResult:
    with _skipping(parsed.source, parsed.path):
        return _unmigrate_parsed(parsed, program)
    raise AssertionError("unreachable")  # for mypy: _skipping re-raises every exception


@dataclass
class _BackResult:
    """What the way back made of one file."""

    path: str
    old: bytes
    original: cst.Module
    module: cst.Module  # with its blocks rewritten; its imports of toggleshim dropped by _finish_back
    blocks: list[_Block]
    other: list[tuple[int, str]]  # other code that needs toggleshim: (line, what)
    imports: list[int]  # the lines of its imports of toggleshim
    plain: bool  # a `with R.toggle_optimizer(X)` block was rewritten: it relies on the assumption (docs)
    outside: set[str]  # the bases from outside the run of those blocks' classes
    new: bytes = b""  # set by _finish_back
    imports_left: int = 0  # the imports of toggleshim left in it (set by _finish_back)

    @property
    def needs(self) -> bool:
        """Something in the file still needs toggleshim (a block left as it is, or other code)."""
        return bool(self.other) or any(b.reason is not None for b in self.blocks)

    @property
    def rewritten(self) -> int:
        return sum(1 for b in self.blocks if b.reason is None)


def _unmigrate_parsed(parsed: _Parsed, program: _Program) -> _BackResult:
    walker = _Unmigrator(parsed.module, parsed.positions, program)
    module = walker.run()
    if walker.needs_contextlib:  # a block with sync_grad became the statements: they enter a context
        module = _add_stdlib_import(module, "contextlib", parsed.path)
    blocks = sorted(walker.blocks, key=lambda b: b.line)
    return _BackResult(parsed.path, parsed.source, parsed.module, module, blocks, sorted(set(walker.other)),
                       walker.imports, bool(walker.plain), walker.outside)


def _finish_back(results: list[_BackResult], drop: bool) -> None:
    """Each file's new bytes; ``drop``: without the imports of toggleshim its code no longer uses
    (only when nothing in the run needs toggleshim: an import anywhere installs the patch for all)."""
    for result in results:
        module = result.module
        if drop:
            module = _drop_imports(module, result.path, _names_used(module))
        result.new = result.old if module is result.original else module.bytes
        result.imports_left = sum(1 for n in _nodes(module) if isinstance(n, (cst.Import, cst.ImportFrom))
                                  and _of_toggleshim(n))


def to_lightning_source(source: bytes, path: str = "<string>") -> _BackResult:
    """``toggleshim migrate --to-lightning`` on one file's bytes on its own: the run is this file."""
    parsed = _parse(source, path)
    program = _Program()
    program.add(path, parsed.module, parsed.positions)
    result = _unmigrate_parsed(parsed, program)
    _finish_back([result], drop=not result.needs)
    return result
