"""Where ``import toggleshim`` goes: isort's and ruff's default sections and order, first-party
decided as ruff decides it by default."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import libcst as cst

from toggleshim._migrate._syntax import _code, _only_expr, _targets

_IMPORT_COMMENT = "# toggleshim makes self.toggle_optimizer(...) usable as a with-block"
_IMPORT_LINE = "import toggleshim  # noqa: F401"


# isort's and ruff's default sections, in order
_FUTURE, _STDLIB, _THIRD_PARTY, _FIRST_PARTY, _LOCAL = range(5)
_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def _first_party(path: str) -> Callable[[str], bool]:
    """Whether a top-level module name is first-party for the file at ``path``, as ruff's defaults
    decide it: the file's own top-level package, or a package or module found in the project root
    or in its ``src``. The project root is the nearest directory above the file holding
    pyproject.toml, setup.py, setup.cfg or .git; without one, the directory that holds the file's
    top-level package (the file's own directory, when it is in no package). The tree decides, never
    the current directory (ruff's fallback): the same tree is rewritten the same from anywhere. A
    source with no file (``<string>``) has no first-party module."""
    if path == "<string>":
        return lambda name: False
    here = os.path.dirname(os.path.abspath(path))
    package = None
    folder = here
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        package, folder = os.path.basename(folder), os.path.dirname(folder)
    root = here
    while not any(os.path.exists(os.path.join(root, m)) for m in _PROJECT_MARKERS):
        parent = os.path.dirname(root)
        if parent == root:
            root = folder
            break
        root = parent

    def known(name: str) -> bool:
        if name == package:
            return True
        return any(
            os.path.isdir(os.path.join(base, name)) or os.path.isfile(os.path.join(base, name + ".py"))
            for base in (root, os.path.join(root, "src"))
        )

    return known


def _import_key(stmt: cst.CSTNode, first_party: Callable[[str], bool]) -> tuple[int, int, str] | None:
    """(section, 0 for ``import x`` / 1 for ``from x import``, module) of an import line, as isort
    and ruff sort by default; None for any other line."""
    if not isinstance(stmt, cst.SimpleStatementLine) or not all(
        isinstance(x, (cst.Import, cst.ImportFrom)) for x in stmt.body
    ):
        return None
    small = stmt.body[0]
    if isinstance(small, cst.ImportFrom):
        if small.relative:
            return (_LOCAL, 1, "")
        name = _code(small.module).strip() if small.module is not None else ""
        kind = 1
    else:
        assert isinstance(small, cst.Import)
        name, kind = _code(small.names[0].name).strip(), 0
    top = name.split(".")[0]
    if top == "__future__":
        section = _FUTURE
    elif top in sys.stdlib_module_names:
        section = _STDLIB
    elif first_party(top):
        section = _FIRST_PARTY
    else:
        section = _THIRD_PARTY
    return (section, kind, name.lower())


def _imports_toggleshim(module: cst.Module, bound: bool = False) -> bool:
    """The file imports toggleshim at the top level (which installs the patch); ``bound``: as
    ``import toggleshim[.sub]``, which binds the name ``toggleshim`` a ``toggleshim.toggle`` block uses."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import) and any(
                    _code(a.name).split(".")[0] == "toggleshim" and (a.asname is None or not bound) for a in small.names
                ):
                    return True
                if (
                    not bound
                    and isinstance(small, cst.ImportFrom)
                    and small.module is not None
                    and _code(small.module).split(".")[0] == "toggleshim"
                ):
                    return True
    return False


def _blanks(lines: Sequence[cst.EmptyLine]) -> int:
    """The blank lines before the first comment."""
    return len(list(itertools.takewhile(lambda line: line.comment is None, lines)))


def _blank_first(stmt: Any, blank: bool) -> Any:
    """``stmt`` with at least one blank line before it (``blank``; kept as they are when it has
    some) or without the blank lines it has before its first comment."""
    lines = list(stmt.leading_lines)
    n = 0
    while n < len(lines) and lines[n].comment is None:
        n += 1
    if blank:
        return stmt if n else stmt.with_changes(leading_lines=[cst.EmptyLine(), *lines])
    return stmt.with_changes(leading_lines=lines[n:]) if n else stmt


def _add_import(module: cst.Module, path: str = "<string>", used: bool = False) -> cst.Module:
    """``import toggleshim`` where isort and ruff (default sections) put it: in the third-party
    section of the file's first run of top-level imports (straight imports before ``from`` imports,
    by name), a section of its own when there is none; unless the file imports toggleshim already.
    ``used``: a ``toggleshim.toggle(...)`` block uses the name (then ``import toggleshim`` itself is
    needed, and it is no unused import: no ``noqa``, no comment)."""
    if _imports_toggleshim(module, bound=used):
        return module
    body = list(module.body)
    first_party = _first_party(path)
    start = 0
    if body and isinstance(_only_expr(body[0]), (cst.SimpleString, cst.ConcatenatedString)):
        start = 1  # the module docstring
    end = start
    while end < len(body) and _import_key(body[end], first_party) is not None:
        end += 1
    new: Any = cst.parse_statement(("import toggleshim" if used else _IMPORT_LINE) + "\n")
    comment = [] if used else [cst.EmptyLine(comment=cst.Comment(_IMPORT_COMMENT))]
    if end == start:  # no imports: at the top (after the docstring), blank lines around
        new = new.with_changes(leading_lines=([cst.EmptyLine()] if start else []) + comment)
        if start < len(body):  # as many blank lines after it as the code needs (PEP 8: two before a def)
            after = body[start]
            blank = max(_blanks(after.leading_lines), 2 if isinstance(after, (cst.FunctionDef, cst.ClassDef)) else 1)
            lines = list(after.leading_lines)[_blanks(after.leading_lines) :]
            body[start] = after.with_changes(leading_lines=[*[cst.EmptyLine()] * blank, *lines])
        body.insert(start, new)
        return module.with_changes(body=body)
    mine = (_THIRD_PARTY, 0, "toggleshim")
    keys = [_import_key(stmt, first_party) for stmt in body[start:end]]
    pos = start + next((n for n, key in enumerate(keys) if key is not None and key > mine), len(keys))
    prev = keys[pos - start - 1] if pos > start else None
    following = keys[pos - start] if pos < end else None
    # A blank line before the comment line (ruff's isort wants one before a comment inside a
    # section); the next import keeps its own blank line unless the new import took over the
    # opening of the third-party section, and the next section gets one.
    # First in the run, it takes over the blank lines the run had (none right after a docstring
    # stays none).
    opens = prev is None or prev[0] != _THIRD_PARTY
    if pos == start:
        first = body[pos].leading_lines
        lead = list(itertools.takewhile(lambda line: line.comment is None, first))
    else:
        lead = [cst.EmptyLine()] if comment or opens else []  # a comment, or a new section: a blank line
    new = new.with_changes(leading_lines=lead + comment)
    if following is not None:
        if opens and following[0] == _THIRD_PARTY:
            body[pos] = _blank_first(body[pos], blank=False)  # it no longer opens the section
        elif following[0] != _THIRD_PARTY:
            body[pos] = _blank_first(body[pos], blank=True)  # the next section, after a blank line
    body.insert(pos, new)
    return module.with_changes(body=body)


def _add_stdlib_import(module: cst.Module, name: str, path: str = "<string>") -> cst.Module:
    """``import <name>`` (a standard-library module the way back writes, ``contextlib``) where isort and
    ruff put it, unless the file imports it at the top level already; at the top (after the docstring
    and ``from __future__``) where the file has no imports."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(small, cst.Import) and any(_code(a.name).strip() == name and a.asname is None
                                                   for a in small.names)
            for small in stmt.body
        ):
            return module
    body = list(module.body)
    first_party = _first_party(path)
    start = 1 if body and isinstance(_only_expr(body[0]), (cst.SimpleString, cst.ConcatenatedString)) else 0
    end = start
    while end < len(body) and _import_key(body[end], first_party) is not None:
        end += 1
    keys = [_import_key(stmt, first_party) for stmt in body[start:end]]
    mine = (_STDLIB, 0, name)
    pos = start + next((n for n, key in enumerate(keys) if key is not None and key > mine), len(keys))
    new: Any = cst.parse_statement(f"import {name}\n")
    if pos < len(body):
        after = body[pos]
        prev = keys[pos - start - 1] if pos > start else None
        following = keys[pos - start] if pos < end else None
        if prev is None or prev[0] != _STDLIB:  # it opens the section: it takes the blank lines there
            lead = list(itertools.takewhile(lambda line: line.comment is None, after.leading_lines))
            new = new.with_changes(leading_lines=lead if pos > start or start else [])
            rest = list(after.leading_lines)[len(lead):]
            gap = [cst.EmptyLine()] * (1 if following is not None and following[0] != _STDLIB else
                                       2 if following is None and isinstance(after, (cst.FunctionDef, cst.ClassDef))
                                       else 1 if following is None else 0)
            body[pos] = after.with_changes(leading_lines=gap + rest)
    body.insert(pos, new)
    return module.with_changes(body=body)


# -- the way back: imports of toggleshim that nothing uses any more --------------------------------


def _import_statement(node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.Import, cst.ImportFrom))


def _of_toggleshim(node: cst.Import | cst.ImportFrom) -> bool:
    """An import of toggleshim or of a module of it (``from . import x`` is not)."""
    if isinstance(node, cst.Import):
        return any(_code(a.name).strip().split(".")[0] == "toggleshim" for a in node.names)
    return not node.relative and node.module is not None and _code(node.module).strip().split(".")[0] == "toggleshim"


def _from_toggleshim(module: cst.Module) -> dict[str, str]:
    """The names the file's top-level ``from toggleshim import a [as b]`` lines bind (``b`` -> ``a``),
    among those the file binds nowhere else."""
    names: dict[str, str] = {}
    bound: set[int] = set()
    for stmt in module.body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if (
                isinstance(small, cst.ImportFrom)
                and not small.relative
                and small.module is not None
                and _code(small.module).strip() == "toggleshim"
                and not isinstance(small.names, cst.ImportStar)
            ):
                for alias in small.names:
                    name = alias.asname.name if alias.asname is not None else alias.name
                    if isinstance(name, cst.Name) and isinstance(alias.name, cst.Name):
                        names[name.value] = alias.name.value
                        bound.add(id(name))
    for target in _targets(module):
        if isinstance(target, cst.Name) and target.value in names and id(target) not in bound:
            del names[target.value]  # rebound elsewhere: not (only) toggleshim's
    return names


def _names_used(module: cst.Module) -> set[str]:
    """Every name the file reads or binds outside its import statements."""
    used: set[str] = set()

    def visit(node: cst.CSTNode) -> None:
        if _import_statement(node):
            return
        if isinstance(node, cst.Name):
            used.add(node.value)
        for child in node.children:
            visit(child)

    visit(module)
    return used


def _bound_by(alias: cst.ImportAlias, straight: bool) -> str:
    """The name an alias binds (``import a.b`` binds ``a``)."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return _code(alias.name).strip().split(".")[0] if straight else _code(alias.name).strip()


def _without_toggleshim(stmt: Any, used: set[str]) -> Any:
    """``stmt`` without its imports of toggleshim that bind a name the file does not use (``used``:
    the names it does): the same object when there are none, None when nothing is left of the line."""
    if not isinstance(stmt, cst.SimpleStatementLine) or not any(_import_statement(s) for s in stmt.body):
        return stmt
    smalls: list[Any] = []
    for small in stmt.body:
        straight = isinstance(small, cst.Import)
        if isinstance(small, cst.Import):
            names = list(small.names)
            ours = [_code(a.name).strip().split(".")[0] == "toggleshim" for a in names]
        elif isinstance(small, cst.ImportFrom) and _of_toggleshim(small) and isinstance(small.names, Sequence):
            names = list(small.names)
            ours = [True] * len(names)
        else:
            smalls.append(small)
            continue
        keep = [a for a, mine in zip(names, ours) if not mine or _bound_by(a, straight) in used]
        if keep:
            last = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            smalls.append(small if len(keep) == len(names) else small.with_changes(names=[*keep[:-1], last]))
    if len(smalls) == len(stmt.body) and all(a is b for a, b in zip(smalls, stmt.body)):
        return stmt
    if not smalls:
        return None
    return stmt.with_changes(body=[*smalls[:-1], smalls[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])


def _drop_imports(module: cst.Module, path: str, used: set[str]) -> cst.Module:
    """The file without its top-level imports of toggleshim that bind a name it does not use, and the
    comment line migrate wrote above them; the blank lines around set as isort sets them (none
    inside a section, the larger of the two counts between sections or after other code)."""
    first_party = _first_party(path)
    out: list[Any] = []
    carried: list[cst.EmptyLine] | None = None  # the lines above the imports dropped just before
    for stmt in module.body:
        new = _without_toggleshim(stmt, used)
        if new is None:
            kept = [line for line in stmt.leading_lines if not _ours(line)]
            carried = kept if carried is None else [*carried, *kept[_blanks(kept) :]]
            continue
        if carried is not None:
            prev = _import_key(out[-1], first_party) if out else None
            key = _import_key(new, first_party)
            if not out:
                n = _blanks(carried)
            elif prev is not None and key is not None and prev[0] == key[0]:
                n = 0  # the same section
            else:
                n = max(_blanks(carried), _blanks(new.leading_lines))
            own = list(new.leading_lines)[_blanks(new.leading_lines) :]
            new = new.with_changes(leading_lines=[*[cst.EmptyLine()] * n, *carried[_blanks(carried) :], *own])
            carried = None
        out.append(new)
    footer = list(module.footer) if carried is None else [*carried[_blanks(carried) :], *module.footer]
    if len(out) == len(module.body) and all(a is b for a, b in zip(out, module.body)):
        return module
    header = list(module.header)
    if module.body and _without_toggleshim(module.body[0], used) is None and header and _ours(header[-1]):
        header.pop()  # the first statement's comment lines are the module's header (LibCST)
    newline = module.has_trailing_newline and bool(out or header or footer)  # nothing left: an empty file
    return module.with_changes(header=header, body=out, footer=footer, has_trailing_newline=newline)


def _ours(line: cst.EmptyLine) -> bool:
    """The comment line migrate writes above ``import toggleshim``."""
    return line.comment is not None and line.comment.value == _IMPORT_COMMENT
