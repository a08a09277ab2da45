"""``toggleshim migrate PATH...``: rewrite statement toggles into blocks, only where provably equivalent.

A span ``R.toggle_optimizer(X)`` ... ``R.untoggle_optimizer(X)`` in one statement list becomes
``with R.toggle_optimizer(X[, zero_grad=False][, step=False]):`` when the block does exactly what
the statements did on every path without an exception (on an exception the block is safer: it
untoggles). Everything else is left as it is and reported with one reason per span. The rules, and
why each is exact, are in docs/migrate.md; this file follows them in the same order.

Modes (as black, ruff and pyupgrade): ``--diff`` (default: a unified diff on stdout, nothing
written), ``--write`` (each file either untouched or fully rewritten: a temporary file in the same
directory, then ``os.replace``), ``--check`` (exit 1 when a statement toggle is not exception-safe).
Exit codes: 0 fine, 1 findings of ``--check`` or files that could not be read or parsed, 2 usage.
Built on LibCST (the ``migrate`` extra), which keeps comments and formatting outside the span.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
except ImportError:  # the optional extra is not installed: main() says how to get it
    _HAVE_LIBCST = False
else:
    _HAVE_LIBCST = True

__all__ = ["main"]

_INSTALL_HINT = 'toggleshim migrate needs LibCST: pip install "toggleshim[migrate]"'
_TOGGLE, _UNTOGGLE = "toggle_optimizer", "untoggle_optimizer"
# Calls that toggle or untoggle: a span holding one of them would nest, and a block nests
# differently from Lightning's statement nesting (LIGHTNING_NOTES: "Nesting").
_TOGGLE_FAMILY = frozenset({_TOGGLE, _UNTOGGLE, "toggled_optimizer", "toggle_model"})
# Names whose use in a span could rebind the optimizer expression behind the tool's back.
_REBINDERS = frozenset({"setattr", "delattr", "vars", "globals", "locals", "exec", "eval", "__dict__"})
_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})
_IMPORT_COMMENT = "# toggleshim makes self.toggle_optimizer(...) usable as a with-block"
_IMPORT_LINE = "import toggleshim  # noqa: F401"


# -- results -------------------------------------------------------------------------------------


@dataclass
class _Span:
    """What the analysis found for one statement toggle."""

    line: int
    text: str  # the toggle as written, e.g. ``self.toggle_optimizer(d_opt)``
    untoggle_line: int | None = None
    reason: str | None = None  # why it is not migrated (None: migrated)
    safe: bool = False  # already exception-safe (an untoggle in the ``finally`` right after it)


@dataclass
class _FileResult:
    path: str
    old: bytes
    new: bytes
    spans: list[_Span] = field(default_factory=list)
    other: list[tuple[int, str]] = field(default_factory=list)  # uses of toggle_optimizer's result


# -- expressions ---------------------------------------------------------------------------------


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _int_index(node: cst.Subscript) -> bool:
    """``a[0]`` or ``a[-1]``: a subscript by one int literal."""
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return False
    value = node.slice[0].slice.value
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return isinstance(value, cst.Integer)


def _ref(node: cst.BaseExpression) -> str | None:
    """The key of an expression that evaluates to the same object each time while nothing rebinds
    it: a name, an attribute chain on one, a subscript by an int literal; else None. The key is the
    code without whitespace (safe: these forms hold no strings)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _ref(node.value)
        return None if base is None or node.attr.value == "__dict__" else f"{base}.{node.attr.value}"
    if isinstance(node, cst.Subscript) and _int_index(node):
        base = _ref(node.value)
        return None if base is None else "".join(_code(node).split())
    return None


def _prefixes(node: cst.BaseExpression) -> set[str]:
    """Every key a rebinding of which changes ``node``: ``self.opts[0]`` -> self, self.opts, self.opts[0]."""
    keys: set[str] = set()
    while True:
        key = _ref(node)
        if key is not None:
            keys.add(key)
        if isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        else:
            return keys


def _method_call(node: cst.CSTNode) -> tuple[cst.BaseExpression, str, cst.Call] | None:
    """``obj.name(...)`` -> (obj, name, call)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.value, node.func.attr.value, node
    return None


def _only_expr(stmt: cst.CSTNode) -> cst.BaseExpression | None:
    """The expression of a line holding exactly one expression statement."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        return stmt.body[0].value
    return None


def _plain_method_line(stmt: cst.CSTNode, name: str, obj_key: str) -> bool:
    """A line that is exactly ``obj.name()`` (no arguments) with ``obj`` spelled as ``obj_key``."""
    expr = _only_expr(stmt)
    found = _method_call(expr) if expr is not None else None
    return found is not None and found[1] == name and not found[2].args and _ref(found[0]) == obj_key


def _toggle_line(stmt: cst.CSTNode, name: str) -> tuple[cst.BaseExpression, cst.Call] | None:
    """A line that is exactly ``R.name(...)`` -> (R, call)."""
    expr = _only_expr(stmt)
    found = _method_call(expr) if expr is not None else None
    return (found[0], found[2]) if found is not None and found[1] == name else None


def _single_arg(call: cst.Call) -> cst.BaseExpression | None:
    if len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0].value
    return None


# -- walking -------------------------------------------------------------------------------------


def _nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _nodes(child)


def _escape(node: cst.CSTNode, in_loop: bool = False) -> str | None:
    """What in ``node`` would leave (or suspend) the span other than by an exception, if anything."""
    if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
        return None  # a new scope: its returns and yields are its own
    if isinstance(node, cst.Return):
        return "a return"
    if isinstance(node, (cst.Yield, cst.Await)):
        return f"{'a yield' if isinstance(node, cst.Yield) else 'an await'}"
    if isinstance(node, (cst.For, cst.With, cst.CompFor)) and node.asynchronous is not None:
        return "an async loop or block (it awaits)"
    if isinstance(node, (cst.Break, cst.Continue)) and not in_loop:
        return f"a {'break' if isinstance(node, cst.Break) else 'continue'}"
    for child in node.children:
        # inside a loop's body break/continue stay in it; its else clause belongs to the outside
        loop_body = isinstance(node, (cst.For, cst.While)) and child is node.body
        found = _escape(child, in_loop or loop_body)
        if found:
            return found
    return None


def _targets(node: cst.CSTNode) -> Iterator[cst.BaseExpression]:
    """Every expression ``node`` (re)binds or deletes."""
    for sub in _nodes(node):
        if isinstance(sub, cst.Assign):
            for t in sub.targets:
                yield from _unpack(t.target)
        elif isinstance(sub, (cst.AnnAssign, cst.AugAssign, cst.NamedExpr, cst.For, cst.Del)):
            yield from _unpack(sub.target)
        elif isinstance(sub, cst.AsName) and isinstance(sub.name, cst.BaseExpression):
            yield from _unpack(sub.name)
        elif isinstance(sub, cst.ImportAlias):
            name: cst.BaseExpression = sub.asname.name if sub.asname is not None else sub.name
            while isinstance(name, cst.Attribute):  # `import a.b` binds `a`
                name = name.value
            if isinstance(name, cst.Name):
                yield name
        elif isinstance(sub, (cst.FunctionDef, cst.ClassDef, cst.MatchAs, cst.MatchStar)) and sub.name is not None:
            yield sub.name


def _unpack(target: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    if isinstance(target, (cst.Tuple, cst.List)):
        for el in target.elements:
            yield from _unpack(el.value)
    elif isinstance(target, cst.StarredElement):
        yield from _unpack(target.value)
    else:
        yield target


def _rebinds(stmts: Sequence[cst.CSTNode], exprs: Sequence[cst.BaseExpression]) -> str | None:
    """Why the statements might make an expression in ``exprs`` evaluate to another object, if so."""
    keys = set().union(*(_prefixes(e) for e in exprs))
    for stmt in stmts:
        for target in _targets(stmt):
            key = _ref(target)
            if isinstance(target, cst.Subscript):
                key = _ref(target.value)  # `opts[i] = ...` may be `opts[0]`
            if key is not None and key in keys:
                return f"`{_code(target).strip()}` is rebound between the toggle and the untoggle"
        for sub in _nodes(stmt):
            if isinstance(sub, cst.Name) and sub.value in _REBINDERS:
                return f"`{sub.value}` between the toggle and the untoggle may rebind the optimizer"
    # `opts.pop(0)`, `opts.reverse()`: a container the optimizer is taken from by index must only be indexed
    bases = {_ref(e.value) for e in exprs if isinstance(e, cst.Subscript)} - {None}
    for stmt in stmts:
        indexed = {id(n.value) for n in _nodes(stmt) if isinstance(n, cst.Subscript) and _int_index(n)}
        for sub in _nodes(stmt):
            if isinstance(sub, (cst.Name, cst.Attribute)) and _ref(sub) in bases and id(sub) not in indexed:
                return f"`{_ref(sub)}`, which the optimizer is taken from, is used between the toggle and the untoggle"
    return None


def _same(a: cst.BaseExpression | None, b: cst.BaseExpression | None) -> bool:
    """The same expression, up to whitespace (only used on expressions ``_ref`` accepts, or to refuse)."""
    return a is not None and b is not None and "".join(_code(a).split()) == "".join(_code(b).split())


def _inert(stmt: cst.CSTNode, protected: set[str]) -> bool:
    """A line that cannot observe or change any gradient or optimizer: ``pass``, a literal, or names
    bound to literals and names (``protected``: names the toggle's expressions start from)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False

    def simple(e: cst.BaseExpression) -> bool:
        if isinstance(e, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString)):
            return True
        if isinstance(e, cst.Name):
            return True
        if isinstance(e, (cst.Tuple, cst.List)):
            return all(isinstance(el, cst.Element) and simple(el.value) for el in e.elements)
        return isinstance(e, cst.Ellipsis)

    for small in stmt.body:
        if isinstance(small, cst.Pass):
            continue
        if isinstance(small, cst.Expr) and simple(small.value) and not isinstance(small.value, cst.Name):
            continue
        if (
            isinstance(small, cst.Assign)
            and simple(small.value)
            and all(
                isinstance(t, cst.Name) and t.value not in protected
                for target in small.targets
                for t in _unpack(target.target)
            )
        ):
            continue
        return False
    return True


# -- the rewrite ---------------------------------------------------------------------------------


class _Migrator:
    """Walks one module: finds statement toggles, decides each span, rebuilds the changed lists."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self.module = wrapper.module
        self.positions = wrapper.resolve(PositionProvider)
        self.spans: list[_Span] = []
        self.other: list[tuple[int, str]] = []
        self.migrated = 0
        self.overridden = any(
            isinstance(n, cst.FunctionDef) and n.name.value in (_TOGGLE, _UNTOGGLE) for n in _nodes(self.module)
        )

    def line(self, node: cst.CSTNode) -> int:
        return int(self.positions[node].start.line)

    def run(self) -> cst.Module:
        new = self.walk(self.module, None)
        assert isinstance(new, cst.Module)
        return new

    # A generic rebuild: children first, a node is replaced only when a child changed (so every
    # untouched subtree is the very same object and prints byte for byte).
    def walk(self, node: cst.CSTNode, outer: str | None) -> cst.CSTNode:
        if isinstance(node, (cst.Module, cst.IndentedBlock)):
            return self.statement_list(node, outer)
        if isinstance(node, cst.With):
            for item in node.items:
                found = _method_call(item.item)
                if found is not None and found[1] in _TOGGLE_FAMILY:
                    outer = f"inside the toggle block at line {self.line(node)}"
        if isinstance(node, cst.SimpleStatementSuite | cst.SimpleStatementLine):
            self.note_statements(node, outer)
        return self.rebuild(node, lambda child: self.walk(child, outer))

    def rebuild(self, node: cst.CSTNode, fn: Any) -> cst.CSTNode:
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if isinstance(value, cst.CSTNode):
                new = fn(value)
                if new is not value:
                    changes[f.name] = new
            elif isinstance(value, (list, tuple)) and value and isinstance(value[0], cst.CSTNode):
                items = [fn(v) for v in value]
                if any(a is not b for a, b in zip(items, value)):
                    changes[f.name] = type(value)(items)
        return node.with_changes(**changes) if changes else node

    def note_statements(self, node: cst.SimpleStatementLine | cst.SimpleStatementSuite, outer: str | None) -> None:
        """Toggles that are not a line of their own, and uses of a toggle's result: reported."""
        for small in node.body:
            for sub in _nodes(small):
                found = _method_call(sub)
                if found is None or found[1] != _TOGGLE:
                    continue
                if isinstance(small, cst.Expr) and small.value is sub:
                    if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1:
                        continue  # a statement toggle: statement_list() decides it
                    suite = isinstance(node, cst.SimpleStatementSuite)
                    where = "its if/for/while header" if suite else "other statements"
                    self.spans.append(_Span(self.line(sub), _code(sub), reason=f"it shares its line with {where}"))
                else:
                    self.other.append((self.line(sub), "the result of toggle_optimizer is used (not a statement)"))

    def statement_list(self, node: cst.Module | cst.IndentedBlock, outer: str | None) -> cst.CSTNode:
        body = list(node.body)
        decided: dict[int, tuple[int, _Span]] = {}  # toggle index -> (untoggle index, span) when migrated
        open_at: list[str | None] = [outer] * len(body)  # what is open around each statement
        for i, stmt in enumerate(body):
            found = _toggle_line(stmt, _TOGGLE)
            if found is None:
                continue
            span = _Span(self.line(stmt), _code(found[1]).strip())
            self.spans.append(span)
            end = self.decide(body, i, found, open_at[i], span)
            if span.reason is None:
                assert end is not None
                decided[i] = (end, span)
            stop = i + 2 if span.safe else end if end is not None else len(body)
            for k in range(i + 1, stop):
                open_at[k] = open_at[k] or f"inside the span of the statement toggle at line {span.line}"
        new_body = [self.walk(stmt, open_at[k]) for k, stmt in enumerate(body)]
        if not decided:
            if all(a is b for a, b in zip(new_body, body)):
                return node
            return node.with_changes(body=new_body)
        out: list[Any] = []
        k = 0
        while k < len(body):
            if k in decided:
                end, _span = decided[k]
                out.append(self.block(body, new_body, k, end))
                self.migrated += 1
                k = end + 1
            else:
                out.append(new_body[k])
                k += 1
        return node.with_changes(body=out)

    def decide(
        self,
        body: Sequence[cst.CSTNode],
        i: int,
        found: tuple[cst.BaseExpression, cst.Call],
        outer: str | None,
        span: _Span,
    ) -> int | None:
        """Decide the span that starts at ``body[i]`` (``span.reason`` stays None when it is migrated);
        return the index of the first untoggle after it in this list (None when there is none)."""
        end = next((k for k in range(i + 1, len(body)) if _toggle_line(body[k], _UNTOGGLE) is not None), None)
        if end is not None:
            span.untoggle_line = self.line(body[end])
        span.reason = self.refusal(body, i, end, found, outer, span)
        return end

    def refusal(
        self,
        body: Sequence[cst.CSTNode],
        i: int,
        end: int | None,
        found: tuple[cst.BaseExpression, cst.Call],
        outer: str | None,
        span: _Span,
    ) -> str | None:
        """Why the span ``body[i] .. body[end]`` cannot become a block (None: it can), rules in order."""
        recv, call = found
        opt = _single_arg(call)
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, cst.Try) and nxt.finalbody is not None and opt is not None:
            for s in nxt.finalbody.body.body:
                u = _toggle_line(s, _UNTOGGLE)
                if u is not None and _same(u[0], recv) and _same(_single_arg(u[1]), opt):
                    span.safe = True
                    return "already exception-safe (untoggled in the finally right after it)"
        if outer is not None:
            return f"it is {outer}: blocks nest differently from statement toggles"
        inside = body[i + 1 : len(body) if end is None else end]
        for stmt in inside:
            if _toggle_line(stmt, _TOGGLE) is not None:
                return (
                    f"another statement toggle (line {self.line(stmt)}) opens before its untoggle: overlapping "
                    "statement toggles nest Lightning's way, blocks nest differently"
                )
            for sub in _nodes(stmt):
                m = _method_call(sub)
                if m is not None and m[1] in _TOGGLE_FAMILY:
                    if m[1] == _UNTOGGLE:
                        return f"a conditional untoggle (line {self.line(sub)}, inside a compound statement)"
                    return f"a {m[1]} call (line {self.line(sub)}) between the toggle and the untoggle would nest"
        if end is None:
            return "no untoggle_optimizer follows it in the same block"
        untoggle = _toggle_line(body[end], _UNTOGGLE)
        assert untoggle is not None
        if not _same(_single_arg(untoggle[1]), opt):
            return f"the untoggle_optimizer at line {span.untoggle_line} is not given the same optimizer expression"
        if not _same(untoggle[0], recv):
            return f"the untoggle_optimizer at line {span.untoggle_line} is called on another object"
        if self.overridden:
            return "this file defines its own toggle_optimizer/untoggle_optimizer (the patch leaves those alone)"
        if opt is None:
            return "toggle_optimizer is given more than the optimizer"
        for expr in (opt, recv):
            if _ref(expr) is None:
                return (
                    f"`{_code(expr).strip()}` may not be the same object at the untoggle (allowed: a name, an "
                    "attribute chain on a name, a subscript by an int literal)"
                )
        escape = next(filter(None, (_escape(s) for s in inside)), None)
        if escape is not None:
            return f"{escape} between the toggle and the untoggle (a block would step and untoggle there)"
        return _rebinds(inside, [opt, recv])

    def block(self, body: Sequence[cst.CSTNode], new_body: Sequence[cst.CSTNode], i: int, end: int) -> cst.With:
        """The ``with`` statement for the migrated span ``body[i] .. body[end]``."""
        toggle_line = body[i]
        found = _toggle_line(toggle_line, _TOGGLE)
        assert found is not None and isinstance(toggle_line, cst.SimpleStatementLine)
        recv, call = found
        opt = _single_arg(call)
        assert opt is not None
        key = _ref(opt)
        assert key is not None
        protected = {k.split(".")[0].split("[")[0] for k in _prefixes(opt) | _prefixes(recv)}
        inside = list(range(i + 1, end))
        carried_front: list[cst.EmptyLine] = []
        carried_back: list[cst.EmptyLine] = list(self.comments(body[end]))
        # zero_grad: the block's entry calls it right after the toggle; a first `X.zero_grad()` may
        # move there when only inert lines stand before it.
        zero_grad = False
        for pos, k in enumerate(inside):
            if _plain_method_line(body[k], "zero_grad", key):
                if all(_inert(body[j], protected) for j in inside[:pos]):
                    zero_grad = True
                    carried_front = list(self.comments(body[k]))
                    inside.remove(k)
                break
        # step: the block's clean exit calls it right before the untoggle; the last `X.step()` may
        # move there when only inert lines follow it.
        step = False
        for pos in range(len(inside) - 1, -1, -1):
            k = inside[pos]
            if _plain_method_line(body[k], "step", key):
                if all(_inert(body[j], protected) for j in inside[pos + 1 :]):
                    step = True
                    carried_back = list(self.comments(body[k])) + carried_back
                    inside.remove(k)
                break
        stmts: list[Any] = [new_body[k] for k in inside] or [cst.SimpleStatementLine([cst.Pass()])]
        if carried_front:
            first = stmts[0]
            stmts[0] = first.with_changes(leading_lines=[*carried_front, *first.leading_lines])
        flags = [name for name, on in (("zero_grad", zero_grad), ("step", step)) if not on]
        if flags:
            space = cst.SimpleWhitespace(" ")
            args = [call.args[0].with_changes(comma=cst.Comma(whitespace_after=space))]
            for n, name in enumerate(flags):
                args.append(
                    cst.Arg(
                        value=cst.Name("False"),
                        keyword=cst.Name(name),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                        comma=cst.Comma(whitespace_after=space) if n < len(flags) - 1 else cst.MaybeSentinel.DEFAULT,
                    )
                )
            call = call.with_changes(args=args)
        return cst.With(
            items=[cst.WithItem(call)],
            body=cst.IndentedBlock(body=stmts, header=toggle_line.trailing_whitespace, footer=carried_back),
            leading_lines=toggle_line.leading_lines,
        )

    @staticmethod
    def comments(stmt: cst.CSTNode) -> Iterator[cst.EmptyLine]:
        """The comments of a line that goes away (kept, as comment lines, where it was)."""
        assert isinstance(stmt, cst.SimpleStatementLine)
        for line in stmt.leading_lines:
            if line.comment is not None:
                yield line
        if stmt.trailing_whitespace.comment is not None:
            yield cst.EmptyLine(comment=stmt.trailing_whitespace.comment)


def _add_import(module: cst.Module) -> cst.Module:
    """``import toggleshim`` after the first run of top-level imports, unless the file imports it."""
    body = list(module.body)
    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import) and any(
                    _code(a.name).split(".")[0] == "toggleshim" for a in small.names
                ):
                    return module
                if (
                    isinstance(small, cst.ImportFrom)
                    and small.module is not None
                    and _code(small.module).split(".")[0] == "toggleshim"
                ):
                    return module

    def is_import(s: cst.CSTNode) -> bool:
        imports = (cst.Import, cst.ImportFrom)
        return isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, imports) for x in s.body)

    pos = 0
    if body and isinstance(_only_expr(body[0]), (cst.SimpleString, cst.ConcatenatedString)):
        pos = 1  # the module docstring
    while pos < len(body) and is_import(body[pos]):
        pos += 1
    new = cst.parse_statement(_IMPORT_LINE + "\n")
    lead = [cst.EmptyLine(comment=cst.Comment(_IMPORT_COMMENT))]
    if pos == 1 and not is_import(body[0]):
        lead.insert(0, cst.EmptyLine())  # right after the docstring: a blank line first
    if pos < len(body) and not (pos and is_import(body[pos - 1])):
        # no import run to join: blank lines between the new import and the code (PEP 8's two before a def)
        after = body[pos]
        blank = [cst.EmptyLine()] * (2 if isinstance(after, (cst.FunctionDef, cst.ClassDef)) else 1)
        body[pos] = after.with_changes(leading_lines=[*blank, *after.leading_lines])
    body.insert(pos, new.with_changes(leading_lines=lead))
    return module.with_changes(body=body)


def migrate_source(source: bytes, path: str = "<string>") -> _FileResult:
    """Migrate one file's bytes (raises ``cst.ParserSyntaxError`` when it does not parse)."""
    module = cst.parse_module(source)
    migrator = _Migrator(MetadataWrapper(module, unsafe_skip_copy=True))
    new = migrator.run()
    if migrator.migrated:
        new = _add_import(new)
    spans = sorted(migrator.spans, key=lambda s: s.line)
    return _FileResult(path, source, new.bytes if new is not module else source, spans, sorted(migrator.other))


# -- files and the command -----------------------------------------------------------------------


class _UsageError(Exception):
    pass


def _python_files(paths: Sequence[str]) -> list[str]:
    """The .py files named or under the directories named, in order (hidden and cache dirs skipped)."""
    files: list[str] = []
    problems: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(
                    d
                    for d in dirs
                    if not d.startswith(".")
                    and d not in _SKIP_DIRS
                    and not os.path.exists(os.path.join(root, d, "pyvenv.cfg"))
                )
                found += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
            if not found:
                problems.append(f"{path}: no Python files under this directory")
            files += found
        elif not os.path.lexists(path):
            problems.append(f"{path}: no such file or directory")
        elif not path.endswith(".py"):
            problems.append(f"{path}: not a Python file (expected a .py file or a directory)")
        else:
            files.append(path)
    if problems:
        raise _UsageError("\n".join(problems))
    return files


def _diff(result: _FileResult) -> str:
    old = result.old.decode("utf-8", "replace").splitlines(keepends=True)
    new = result.new.decode("utf-8", "replace").splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(old, new, f"{result.path}", f"{result.path}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _write_atomically(path: str, data: bytes) -> None:
    """Replace the file's content: a temporary file beside it, then ``os.replace`` (the file is either
    untouched or fully rewritten; its permission bits are kept, a symlink stays a symlink)."""
    target = os.path.realpath(path)
    mode = stat.S_IMODE(os.stat(target).st_mode)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".toggleshim-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _syntax_error(source: bytes, path: str, exc: cst.ParserSyntaxError) -> str:
    """``line:column: cannot parse: why``, in Python's own words where Python agrees it does not parse."""
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as py:
        return f"{py.lineno}:{py.offset}: cannot parse: {py.msg}"
    except ValueError:  # null bytes
        pass
    return f"{exc.raw_line}:{exc.raw_column + 1}: cannot parse: {exc.message}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toggleshim migrate",
        description="Rewrite statement toggles (toggle_optimizer ... untoggle_optimizer) into "
        "`with self.toggle_optimizer(opt):` blocks where provably equivalent (docs/migrate.md).",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".py files or directories")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--diff", action="store_const", dest="mode", const="diff", help="print a diff (default)")
    mode.add_argument("--write", action="store_const", dest="mode", const="write", help="rewrite the files in place")
    mode.add_argument(
        "--check",
        action="store_const",
        dest="mode",
        const="check",
        help="exit 1 when a statement toggle is not exception-safe (prints file:line and why)",
    )
    parser.set_defaults(mode="diff")
    return parser


def main(argv: list[str]) -> int:
    """``toggleshim migrate``; returns the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    if not _HAVE_LIBCST:
        sys.stderr.write(f"toggleshim migrate: {_INSTALL_HINT}\n")
        return 2
    try:
        files = _python_files(args.paths)
    except _UsageError as exc:
        sys.stderr.write(f"toggleshim migrate: {exc}\nnothing was changed\n")
        return 2
    failed = findings = changed = migrated = 0
    for path in files:
        try:
            source = _read(path)
        except OSError as exc:
            sys.stderr.write(f"{path}: cannot read: {exc.strerror or exc}\n")
            failed += 1
            continue
        try:
            result = migrate_source(source, path)
        except cst.ParserSyntaxError as exc:
            sys.stderr.write(f"{path}:{_syntax_error(source, path, exc)}; skipped\n")
            failed += 1
            continue
        except (UnicodeDecodeError, SyntaxError) as exc:  # a bad coding cookie or undecodable bytes
            sys.stderr.write(f"{path}: cannot decode: {exc}; skipped\n")
            failed += 1
            continue
        if args.mode == "check":
            for span in result.spans:
                if span.safe:
                    continue
                findings += 1
                fix = "`toggleshim migrate` rewrites it" if span.reason is None else f"not migrated: {span.reason}"
                sys.stdout.write(
                    f"{path}:{span.line}: `{span.text}` as a statement: an exception before its untoggle "
                    f"leaves the optimizers toggled; {fix}\n"
                )
            continue
        for span in result.spans:
            if span.reason is not None:
                sys.stderr.write(f"{path}:{span.line}: not migrated: {span.reason}\n")
        for line, reason in result.other:
            sys.stderr.write(f"{path}:{line}: not migrated: {reason}\n")
        n = sum(1 for s in result.spans if s.reason is None)
        if result.new == result.old:
            continue
        changed += 1
        migrated += n
        if args.mode == "write":
            try:
                _write_atomically(path, result.new)
            except OSError as exc:
                sys.stderr.write(f"{path}: cannot write: {exc.strerror or exc}; left unchanged\n")
                failed += 1
                continue
            sys.stderr.write(f"{path}: migrated {n} span{'s' * (n != 1)}\n")
        else:
            sys.stdout.write(_diff(result))
    if args.mode == "check":
        sys.stderr.write(
            f"toggleshim migrate --check: {findings} statement toggle{'s' * (findings != 1)} not exception-safe "
            f"in {len(files)} file{'s' * (len(files) != 1)}\n"
        )
        return 1 if findings or failed else 0
    verb = "rewrote" if args.mode == "write" else "would rewrite"
    sys.stderr.write(
        f"toggleshim migrate: {verb} {changed} of {len(files)} file{'s' * (len(files) != 1)} "
        f"({migrated} span{'s' * (migrated != 1)})" + (f"; {failed} could not be processed" if failed else "") + "\n"
    )
    return 1 if failed else 0
