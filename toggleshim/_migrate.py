"""``toggleshim migrate PATH...``: rewrite statement toggles into blocks, only where provably equivalent.

A span ``R.toggle_optimizer(X)`` ... ``R.untoggle_optimizer(X)`` in one statement list becomes
``with R.toggle_optimizer(X[, zero_grad=False][, step=False]):`` when the block does exactly what
the statements did on every path without an exception (on an exception the block is safer: it
untoggles). Everything else is left as it is and reported with one reason per span. The rules, and
why each is exact, are in docs/migrate.md; this file follows them in the same order. Overrides of
``toggle_optimizer`` are looked for in every file of the run (two passes: every file's classes are
indexed, then each file is rewritten); where one may return None, the block is
``with toggleshim.toggle(R, X):``, the manual sequence with the module's own methods.
``--assume NAME`` opts into documented assumptions that let more spans reach the plain block.

Modes (as black, ruff and pyupgrade): ``--diff`` (default: a unified diff on stdout, nothing
written), ``--write`` (each file either untouched or fully rewritten: a temporary file in the same
directory, then ``os.replace``), ``--check`` (exit 1 when a statement toggle is not exception-safe).
Exit codes: 0 fine, 1 findings of ``--check`` or files that could not be processed (each reported
as ``path: skipped: reason``; one file never stops the run), 2 usage, 141 the output pipe closed.
Built on LibCST (the ``migrate`` extra), which keeps comments and formatting outside the span.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import itertools
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toggleshim._flavours import FLAVOURS

if TYPE_CHECKING:
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider


def _load_libcst() -> bool:
    """Import LibCST (the ``migrate`` extra) into this module, on first use; False when it is not
    installed. Not at import: ``toggleshim migrate --help`` and usage errors need none of it (its
    import takes most of a second)."""
    global cst, MetadataWrapper, PositionProvider
    try:
        import libcst as cst
        from libcst.metadata import MetadataWrapper, PositionProvider
    except ImportError:  # the optional extra is not installed: main() says how to get it
        return False
    return True


__all__ = ["main"]

_INSTALL_HINT = 'toggleshim migrate needs LibCST: pip install "toggleshim[migrate]"'
_TOGGLE, _UNTOGGLE = "toggle_optimizer", "untoggle_optimizer"
# Calls that toggle or untoggle: a span holding one of them would nest, and a block nests
# differently from Lightning's statement nesting (README, "Semantics": nesting).
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
    plain: int = 0  # blocks written `with R.toggle_optimizer(X)`: they rely on the assumption (docs)
    outside: set[str] = field(default_factory=set)  # bases from outside the run of their classes


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


def _root(node: cst.BaseExpression) -> str | None:
    """The name an attribute chain or subscript starts from: ``self.opts[0]`` -> ``self``."""
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


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


def _zero_grad_line(stmt: cst.CSTNode, obj_key: str, torch2: bool) -> bool:
    """A line that is exactly ``X.zero_grad()``; with the ``torch2-defaults`` assumption also
    ``X.zero_grad(set_to_none=True)`` (torch >= 2.0's default: the block's ``X.zero_grad()``)."""
    if _plain_method_line(stmt, "zero_grad", obj_key):
        return True
    expr = _only_expr(stmt)
    found = _method_call(expr) if expr is not None else None
    if not torch2 or found is None or found[1] != "zero_grad" or _ref(found[0]) != obj_key:
        return False
    args = found[2].args
    return (
        len(args) == 1
        and args[0].keyword is not None
        and args[0].keyword.value == "set_to_none"
        and isinstance(args[0].value, cst.Name)
        and args[0].value.value == "True"
    )


# Names through which a line visibly touches gradients: the ``forward-reads-no-grad`` assumption never
# moves ``zero_grad()`` across a line naming one of them (it covers only what the tool cannot see).
_GRADIENT_NAMES = frozenset(
    {
        "grad",
        "backward",
        "manual_backward",
        "step",
        "zero_grad",
        "clip_gradients",
        "clip_grad_norm_",
        "clip_grad_value_",
        "autograd",
        "_grad",
    }
    | _TOGGLE_FAMILY
)


def _steps(stmt: cst.CSTNode) -> bool:
    """The statement may call a ``.step(...)`` anywhere in it (under a condition, in a loop, with a
    closure; X spelled another way, or an alias of it): a block that steps on exit too would refuse
    a second step of its optimizer, so X's last step stays in the body."""
    return any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "step"
        for n in _nodes(stmt)
    )


def _touches_gradients(stmt: cst.CSTNode) -> bool:
    """The line names a gradient, a backward, a step, a zero_grad, a clipping or a toggle."""
    return any(isinstance(n, cst.Name) and n.value in _GRADIENT_NAMES for n in _nodes(stmt))


# Opt-in assumptions (``--assume NAME``, off by default; docs/migrate.md, "Assumptions")
ASSUMPTIONS = {
    "torch2-defaults": "optimizers keep torch >= 2.0 defaults: `X.zero_grad(set_to_none=True)` is the block's "
    "`X.zero_grad()`",
    "forward-reads-no-grad": "the code between the toggle and `X.zero_grad()` reads and writes no gradient "
    "(through what it calls, too), and if it raises, X's gradients are not needed: `zero_grad()` may move above it",
}


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
    """Every expression ``node`` (re)binds or deletes, through each binding form of Python's grammar:
    assignment targets (unpacked, starred, attributes, subscripts), augmented and annotated assignment,
    ``for`` targets, ``with ... as``, ``except ... as`` and ``except* ... as``, the walrus, ``import a.b``
    (binds ``a``), ``import ... as``, ``from m import x [as y]``, ``def`` and ``class`` names, ``del``,
    ``type X = ...``, and ``match`` patterns: capture and ``as`` names (also inside sequence, class,
    mapping and or-patterns), ``*rest`` and a mapping's ``**rest``. Nested ``def``/``lambda``/``class``
    bodies are walked too (conservative: their bindings may be ``nonlocal``). ``from m import *`` and
    ``global``/``nonlocal`` bind names that cannot be listed here: ``_rebinds`` and ``_Migrator`` refuse
    them. Comprehension targets are the comprehension's own scope and rebind nothing outside."""
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
        elif isinstance(sub, cst.MatchMapping) and sub.rest is not None:  # `case {**rest}:`
            yield sub.rest
        elif isinstance(sub, cst.TypeAlias):  # `type X = ...` (Python 3.12)
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
        for sub in _nodes(stmt):
            if isinstance(sub, cst.ImportFrom) and isinstance(sub.names, cst.ImportStar):
                return f"`{_code(sub).strip()}` between the toggle and the untoggle may rebind any name"
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


def _arguments_refusal(call: cst.Call) -> str:
    """Why ``toggle_optimizer(...)`` is not Lightning 2's statement toggle ``toggle_optimizer(optimizer)``."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    if len(positional) == 2 and len(call.args) == 2:
        return (
            "`toggle_optimizer(optimizer, optimizer_idx)` is Lightning 1.x's form (its untoggle_optimizer takes the "
            "index); the block needs Lightning >= 2.0, where toggle_optimizer takes the optimizer alone"
        )
    if keywords & {"zero_grad", "step"}:
        return "toggle_optimizer is already given zero_grad=/step= (toggleshim's call, not Lightning's statement form)"
    if not call.args:
        return "toggle_optimizer is given no optimizer"
    return "toggle_optimizer is given more than the optimizer (or it by keyword, or *args): not Lightning's form"


def _same(a: cst.BaseExpression | None, b: cst.BaseExpression | None) -> bool:
    """The same expression, up to whitespace (only used on expressions ``_ref`` accepts, or to refuse)."""
    return a is not None and b is not None and "".join(_code(a).split()) == "".join(_code(b).split())


# Names that are constants of the language (keywords), not variables: reading them cannot fail.
_CONSTANT_NAMES = frozenset({"None", "True", "False"})


def _literal(e: cst.BaseExpression) -> bool:
    """An expression whose evaluation runs no user code, reads no variable and cannot raise: a number
    (signed or not), a string or bytes without an f-string part (implicit concatenation included),
    ``...``, ``None``/``True``/``False``, and tuple or list displays of these. An allow-list: any
    other form (an f-string anywhere, a name, an attribute, a subscript, an operator, a comparison,
    a call) may run user code (``__format__``, a property, ``__getitem__``, ``__eq__``...) or fail."""
    if isinstance(e, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis)):
        return True
    if isinstance(e, cst.ConcatenatedString):  # `"a: " f"{x}"` is a ConcatenatedString too
        return _literal(e.left) and _literal(e.right)
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, (cst.Minus, cst.Plus)):
        return isinstance(e.expression, (cst.Integer, cst.Float, cst.Imaginary))
    if isinstance(e, cst.Name):
        return e.value in _CONSTANT_NAMES
    if isinstance(e, (cst.Tuple, cst.List)):
        return all(isinstance(el, cst.Element) and _literal(el.value) for el in e.elements)
    return False


def _inert_store(target: cst.BaseExpression, value: cst.BaseExpression, protected: set[str]) -> bool:
    """Binding ``value`` (a literal) to ``target`` runs no user code and cannot raise: a plain name
    (not one the toggle's expressions start from), or a tuple/list of such targets unpacking a
    display of exactly as many elements (unpacking anything else calls its ``__iter__``)."""
    if isinstance(target, cst.Name):
        return target.value not in protected
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) != len(value.elements):
            return False
        return all(
            isinstance(t, cst.Element) and isinstance(v, cst.Element) and _inert_store(t.value, v.value, protected)
            for t, v in zip(target.elements, value.elements)
        )
    return False


def _inert(stmt: cst.CSTNode, protected: set[str], bindings: bool = True) -> bool:
    """A line that can run no user code, read no state and raise nothing, so ``zero_grad()`` and
    ``step()`` may move across it: ``pass``, a literal, or (``bindings``: in a function body, where a
    name is a local no ``step()`` can read) literals bound to plain names (see ``_literal``,
    ``_inert_store``; ``protected``: names the toggle's expressions start from). At module or class
    level a name is a global or class attribute that an optimizer's ``step`` may read, and the store
    goes through a mapping (a class's ``__prepare__``, ``exec``'s locals) that may run user code."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Pass):
            continue
        if isinstance(small, cst.Expr) and _literal(small.value):
            continue
        if (
            bindings
            and isinstance(small, cst.Assign)
            and _literal(small.value)
            and all(_inert_store(t.target, small.value, protected) for t in small.targets)
        ):
            continue
        return False
    return True


# -- the program: classes across the files of the run -------------------------------------------
#
# Which toggle_optimizer a statement toggle calls depends on the class of its receiver at run time:
# the class the method is defined in, any subclass of it, and every base of those (a mixin of a
# subclass included). Those classes are looked for in every file of the run, bases resolved through
# the imports of their file; what cannot be resolved is over-approximated (every class of the run of
# that name), so a class of the run is never missed. Classes outside the run are assumed not to
# override toggle_optimizer in a way a block cannot use (said once in the output; docs/migrate.md).

# Lightning's own LightningModule, as it is imported: a base outside the run that overrides nothing
_LIGHTNING_BASES = frozenset(
    f"{package}{sub}.LightningModule"
    for package in (p for f in FLAVOURS for p in (*f.reexports, f.name))
    for sub in ("", ".core", ".core.module", ".core.lightning")
)
_BUILTIN_BASES = frozenset({"object", "Generic", "Protocol", "ABC"})
_IDENTITY_DECORATORS = frozenset({"override", "typing.override", "typing_extensions.override"})


@dataclass(eq=False)
class _Class:
    """A class of the run, as far as the rewrite cares."""

    path: str
    name: str
    line: int
    node: cst.ClassDef
    # its toggle_optimizer: None (none of its own), "returns" (``return super().toggle_optimizer(opt)``
    # is its last line and its only return: it returns the toggle, so a ``with`` can use it), "other"
    toggle: str | None = None
    forwards: bool = False  # "returns" and it forwards ``**kwargs``: the block's flags reach super()
    parents: list[_Class] = field(default_factory=list)
    outside: set[str] = field(default_factory=set)  # bases from outside the run, dotted


@dataclass
class _Imports:
    """What a file's imports bind: a name -> (level, module, attribute or None) targets."""

    names: dict[str, list[tuple[int, str, str | None]]] = field(default_factory=dict)
    stars: list[tuple[int, str]] = field(default_factory=list)


def _super_toggle(expr: cst.BaseExpression | None, bare: bool = False) -> cst.Call | None:
    """``super(...).toggle_optimizer(...)`` -> the call; ``bare``: ``super()`` with no arguments only
    (``super(Other, self)`` may skip classes of the MRO)."""
    found = _method_call(expr) if expr is not None else None
    if found is None or found[1] != _TOGGLE:
        return None
    recv = found[0]
    if isinstance(recv, cst.Call) and isinstance(recv.func, cst.Name) and recv.func.value == "super":
        return found[2] if not (bare and recv.args) else None
    return None


def _toggle_kind(node: cst.FunctionDef) -> tuple[str, bool]:
    """("returns", forwards) when the override's last line is ``return super().toggle_optimizer(opt)``
    (``opt`` its parameter, ``**kw`` forwarded when it takes one), it has no other ``return`` nor
    ``yield``, no decorator, and never rebinds ``opt``/``kw``: then it returns the toggle super()
    made, on every path without an exception. Else ("other", False): it may return None."""
    params = node.params
    plain = [p for p in params.params if p.default is None]
    if (
        node.asynchronous is not None
        or node.decorators
        or len(plain) != 2
        or len(params.params) != 2
        or params.posonly_params
        or params.kwonly_params
        or not isinstance(params.star_arg, cst.MaybeSentinel)
        or not isinstance(node.body, cst.IndentedBlock)
    ):
        return "other", False
    opt = plain[1].name.value
    kw = params.star_kwarg.name.value if isinstance(params.star_kwarg, cst.Param) else None
    *before, last = node.body.body
    ret = last.body[0] if isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 else None
    call = _super_toggle(ret.value, bare=True) if isinstance(ret, cst.Return) else None
    if call is None:
        return "other", False
    args = [(a.star, a.value.value if isinstance(a.value, cst.Name) else None, a.keyword) for a in call.args]
    if args[:1] != [("", opt, None)] or args[1:] not in ([], [("**", kw, None)] if kw else []):
        return "other", False
    for stmt in before:
        if _escape(stmt) is not None:  # a return, yield or await before the last line
            return "other", False
        if any(isinstance(t, cst.Name) and t.value in (opt, kw) for t in _targets(stmt)):
            return "other", False
    return "returns", len(args) == 2


def _describe_class(path: str, node: cst.ClassDef, line: int) -> _Class:
    info = _Class(path, node.name.value, line, node)
    for stmt in node.body.body:
        if isinstance(stmt, cst.FunctionDef):
            if stmt.name.value == _TOGGLE:
                info.toggle, info.forwards = _toggle_kind(stmt)
        elif any(isinstance(t, cst.Name) and t.value == _TOGGLE for t in _targets(stmt)):
            # `toggle_optimizer = something` in the class body: whatever it is, it may return None
            info.toggle, info.forwards = "other", False
    return info


def _module_parts(path: str) -> list[str]:
    """``a/b/models.py`` -> [..., "a", "b", "models"]; a package's ``__init__.py`` is the package."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    parts[-1] = parts[-1][: -len(".py")] if parts[-1].endswith(".py") else parts[-1]
    return parts[:-1] if parts[-1] == "__init__" else parts


class _Program:
    """The classes of every file of the run and how they inherit from one another."""

    def __init__(self) -> None:
        self.classes: list[_Class] = []
        self.by_node: dict[int, _Class] = {}
        self.files: dict[str, tuple[list[_Class], _Imports]] = {}
        self.parts: dict[str, list[str]] = {}
        self.tails: dict[str, list[str]] = {}  # a module's last name -> the files of the run that may be it
        self.names: dict[str, set[_Class]] = {}
        self._linked = False

    def add(self, path: str, module: cst.Module, positions: Any) -> None:
        """Index one parsed file (``positions``: LibCST's PositionProvider for it)."""
        classes: list[_Class] = []
        imports = _Imports()
        for n in _nodes(module):
            if isinstance(n, cst.ClassDef):
                info = _describe_class(path, n, int(positions[n].start.line))
                classes.append(info)
                self.by_node[id(n)] = info
            elif isinstance(n, cst.Import):
                for alias in n.names:
                    dotted = _code(alias.name).strip()
                    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                        imports.names.setdefault(alias.asname.name.value, []).append((0, dotted, None))
                    else:  # `import a.b` binds `a`
                        imports.names.setdefault(dotted.split(".")[0], []).append((0, dotted.split(".")[0], None))
            elif isinstance(n, cst.ImportFrom):
                level = len(n.relative)
                dotted = _code(n.module).strip() if n.module is not None else ""
                if isinstance(n.names, cst.ImportStar):
                    imports.stars.append((level, dotted))
                    continue
                for alias in n.names:
                    name = _code(alias.name).strip()
                    bound = alias.asname.name if alias.asname is not None else alias.name
                    if isinstance(bound, cst.Name):
                        imports.names.setdefault(bound.value, []).append((level, dotted, name))
        self.classes += classes
        for c in classes:
            self.names.setdefault(c.name, set()).add(c)
        self.files[path] = (classes, imports)
        self.parts[path] = parts = _module_parts(path)
        self.tails.setdefault(parts[-1], []).append(path)
        self._linked = False

    # -- resolving names -------------------------------------------------------------------------

    def _module_files(self, path: str, level: int, dotted: str) -> list[str]:
        """The files of the run a module reference from ``path`` may be: relative ones by path,
        absolute ones by the tail of the path (``pkg.models`` is any ``.../pkg/models.py`` or
        ``.../pkg/models/__init__.py`` of the run)."""
        want = [p for p in dotted.split(".") if p]
        if level:
            base = self.parts[path][:-1] if not path.endswith("__init__.py") else self.parts[path]
            full = base[: len(base) - (level - 1)] + want
            return [f for f in self.tails.get(full[-1], []) if self.parts[f] == full] if full else []
        if not want:
            return []
        return [f for f in self.tails.get(want[-1], []) if self.parts[f][-len(want) :] == want]

    def _named(self, name: str) -> set[_Class]:
        return set(self.names.get(name, ()))

    def _lookup(self, path: str, name: str, seen: set[tuple[str, str]]) -> tuple[set[_Class], set[str]] | None:
        """The classes ``name`` is in the file ``path`` (at any level: over-approximated), and the
        dotted names it is outside the run; None when the file does not say."""
        if (path, name) in seen:
            return set(), set()
        seen.add((path, name))
        classes, imports = self.files[path]
        found = {c for c in classes if c.name == name}
        outside: set[str] = set()
        for level, dotted, attr in imports.names.get(name, []):
            if attr is None:
                continue  # a module, not a class
            sub = self._resolve_in_module(path, level, dotted, attr, seen)
            found |= sub[0]
            outside |= sub[1]
        if not found and not outside:
            for level, dotted in imports.stars:
                for f in self._module_files(path, level, dotted):
                    sub2 = self._lookup(f, name, seen)
                    if sub2 is not None:
                        found |= sub2[0]
                        outside |= sub2[1]
        if not found and not outside:
            return None
        return found, outside

    def _resolve_in_module(
        self, path: str, level: int, dotted: str, attr: str, seen: set[tuple[str, str]]
    ) -> tuple[set[_Class], set[str]]:
        files = self._module_files(path, level, dotted)
        if not files:
            where = "." * level + dotted
            return set(), {f"{where}.{attr}" if dotted else f"{where}{attr}"}
        found: set[_Class] = set()
        outside: set[str] = set()
        for f in files:
            sub = self._lookup(f, attr, seen)
            if sub is None:  # the module is in the run but does not visibly define it
                found |= self._named(attr)
            else:
                found |= sub[0]
                outside |= sub[1]
        return found, outside

    def _resolve_base(self, path: str, expr: cst.BaseExpression) -> tuple[set[_Class], set[str]]:
        """The classes of the run a base expression may be, and the dotted names outside the run."""
        if isinstance(expr, cst.Subscript):  # Generic[T], Base[T]
            expr = expr.value
        if isinstance(expr, cst.Name):
            if expr.value in _BUILTIN_BASES:
                return set(), set()
            found = self._lookup(path, expr.value, set())
            return found if found is not None else (self._named(expr.value), set())
        if isinstance(expr, cst.Attribute) and _ref(expr) is not None:
            dotted_expr = _ref(expr)
            assert dotted_expr is not None
            root, *middle, last = dotted_expr.split(".")
            found_classes: set[_Class] = set()
            outside: set[str] = set()
            targets = self.files[path][1].names.get(root, [])
            for level, dotted, attr in targets:
                module = ".".join(p for p in (dotted, attr, *middle) if p)
                sub = self._resolve_in_module(path, level, module, last, set())
                found_classes |= sub[0]
                outside |= sub[1]
            if not targets:
                found_classes = self._named(last)
            return found_classes, outside
        # a call or any other expression: it may be any class of the run, or one from outside
        return set(self.classes), {f"`{_code(expr).strip()}`"}

    def link(self) -> None:
        if self._linked:
            return
        for c in self.classes:
            c.parents, c.outside = [], set()
            for arg in c.node.bases:
                found, outside = self._resolve_base(c.path, arg.value)
                c.parents += [p for p in found if p is not c]
                c.outside |= outside
        self._linked = True

    def relevant(self, cls: _Class | None) -> tuple[set[_Class], set[str]]:
        """Every class of the run whose toggle_optimizer a method of ``cls`` may call on ``self``
        (None: on an object of any class), and the bases outside the run among them."""
        self.link()
        if cls is None:
            return set(self.classes), set().union(*(c.outside for c in self.classes))
        below = {cls}
        grew = True
        while grew:  # every subclass in the run
            more = {c for c in self.classes if c not in below and any(p in below for p in c.parents)}
            below |= more
            grew = bool(more)
        result: set[_Class] = set()
        todo = list(below)
        while todo:  # and every base of those
            c = todo.pop()
            if c not in result:
                result.add(c)
                todo += c.parents
        return result, set().union(*(c.outside for c in result))


# -- the rewrite ---------------------------------------------------------------------------------


def _toggling(found: tuple[cst.BaseExpression, str, cst.Call]) -> bool:
    """A call that toggles or untoggles: a toggle_optimizer-like method, or ``toggleshim.toggle(...)``."""
    return found[1] in _TOGGLE_FAMILY or (found[1] == "toggle" and _ref(found[0]) == "toggleshim")


def _shadows_toggleshim(module: cst.Module) -> str | None:
    """How the file binds the name ``toggleshim`` to something else than the package, if it does (a
    ``toggleshim.toggle(...)`` block would not reach the package): any binding form but ``import
    toggleshim[.sub]`` (an assignment, ``import x as toggleshim``, ``from x import toggleshim``, a
    parameter), or ``from x import *`` (it may bind any name)."""
    plain: set[int] = set()
    for n in _nodes(module):
        if isinstance(n, cst.Import):
            for alias in n.names:
                root: cst.BaseExpression = alias.name
                while isinstance(root, cst.Attribute):
                    root = root.value
                if alias.asname is None:
                    plain.add(id(root))
        elif isinstance(n, cst.ImportFrom) and isinstance(n.names, cst.ImportStar):
            return f"`{_code(n).strip()}` may bind the name `toggleshim`"
        elif isinstance(n, cst.Param) and n.name.value == "toggleshim":
            return "a parameter is named `toggleshim`"
    for target in _targets(module):
        if isinstance(target, cst.Name) and target.value == "toggleshim" and id(target) not in plain:
            return "the file binds the name `toggleshim` to something else than the package"
    return None


class _Migrator:
    """Walks one module: finds statement toggles, decides each span, rebuilds the changed lists."""

    def __init__(
        self, module: cst.Module, positions: Any, program: _Program, assume: frozenset[str] = frozenset()
    ) -> None:
        self.module = module
        self.assume = assume
        self.positions = positions
        self.program = program
        self.spans: list[_Span] = []
        self.other: list[tuple[int, str]] = []
        self.migrated = 0
        self.plain = 0  # blocks written `with R.toggle_optimizer(X)` (they rely on the assumption)
        self.through = 0  # blocks written `with toggleshim.toggle(R, X)` (they need `import toggleshim`)
        self.outside: set[str] = set()  # bases from outside the run the plain blocks' classes have
        self.scopes: list[cst.FunctionDef | cst.ClassDef] = []  # the defs and classes around the walk
        self.shadowed = _shadows_toggleshim(module)
        # `global x` / `nonlocal x` anywhere in the file: a function declaring it may rebind `x` when
        # called from inside a span, where no binding form is visible.
        self.declared: dict[str, tuple[str, int]] = {}
        for n in _nodes(self.module):
            if isinstance(n, (cst.Global, cst.Nonlocal)):
                kind = "global" if isinstance(n, cst.Global) else "nonlocal"
                for item in n.names:
                    self.declared.setdefault(item.name.value, (kind, self.line(n)))

    def line(self, node: cst.CSTNode) -> int:
        return int(self.positions[node].start.line)

    def run(self) -> cst.Module:
        new = self.walk(self.module, None)
        assert isinstance(new, cst.Module)
        return new

    # A generic rebuild: children first, a node is replaced only when a child changed (so every
    # untouched subtree is the very same object and prints byte for byte).
    def walk(self, node: cst.CSTNode, outer: str | None) -> cst.CSTNode:
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self.scopes.append(node)
            try:
                return self.rebuild(node, lambda child: self.walk(child, outer))
            finally:
                self.scopes.pop()
        if isinstance(node, (cst.Module, cst.IndentedBlock)):
            return self.statement_list(node, outer)
        if isinstance(node, cst.With):
            for item in node.items:
                found = _method_call(item.item)
                if found is not None and _toggling(found):
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

    def delegates(self, call: cst.CSTNode) -> bool:
        """``super().toggle_optimizer(...)`` inside an override of ``toggle_optimizer``: the override's
        own toggle, not a statement toggle of the user's (never reported, never a finding)."""
        scope = self.scopes[-1] if self.scopes else None
        return (
            isinstance(scope, cst.FunctionDef)
            and scope.name.value == _TOGGLE
            and isinstance(call, cst.BaseExpression)
            and _super_toggle(call) is not None
        )

    def receiver_class(self, recv: cst.BaseExpression) -> _Class | None:
        """The class whose method the span is in, when the receiver is that method's ``self`` (its
        first parameter, never rebound in it); None when the receiver may be an object of any class."""
        if len(self.scopes) < 2 or not isinstance(recv, cst.Name):
            return None
        fn, cls = self.scopes[-1], self.scopes[-2]
        if not isinstance(fn, cst.FunctionDef) or not isinstance(cls, cst.ClassDef):
            return None
        # a staticmethod, a classmethod, or a decorator that may call it with another object (only
        # typing's `@override`, which returns the function itself, is known not to)
        if any(_ref(d.decorator) not in _IDENTITY_DECORATORS for d in fn.decorators):
            return None
        params = [*fn.params.posonly_params, *fn.params.params]
        if not params or params[0].name.value != recv.value:
            return None
        if any(isinstance(t, cst.Name) and t.value == recv.value for t in _targets(fn.body)):
            return None
        return self.program.by_node.get(id(cls))

    def form(self, recv: cst.BaseExpression, flags: bool) -> tuple[bool, set[str]]:
        """(True: ``with R.toggle_optimizer(X)`` is the manual sequence; False: only ``with
        toggleshim.toggle(R, X)`` is), and the bases from outside the run the receiver's classes have.
        A ``with`` needs toggle_optimizer to return the toggle: every override among the classes the
        receiver may be of must be ``return super().toggle_optimizer(opt)``, forwarding ``**kwargs``
        when the block passes flags. ``toggleshim.toggle`` calls the module's own toggle_optimizer with
        the optimizer alone and runs the rest of the sequence around it, whatever the override returns."""
        classes, outside = self.program.relevant(self.receiver_class(recv))
        own = [c for c in classes if c.toggle is not None]
        return all(c.toggle == "returns" and (c.forwards or not flags) for c in own), outside - _LIGHTNING_BASES

    def note_statements(self, node: cst.SimpleStatementLine | cst.SimpleStatementSuite, outer: str | None) -> None:
        """Toggles that are not a line of their own, and uses of a toggle's result: reported."""
        for small in node.body:
            for sub in _nodes(small):
                found = _method_call(sub)
                if found is None or found[1] != _TOGGLE or self.delegates(sub):
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
            if found is None or self.delegates(found[1]):
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
        # The untoggle's comments (above it, or on its line) go after the block, at the untoggle's
        # indentation: they were on that side of the body; inside the block they would describe it.
        after: list[cst.EmptyLine] = []
        k = 0
        while k < len(body):
            item: Any = new_body[k]
            nxt, comments = k + 1, []
            if k in decided:
                end, _span = decided[k]
                item = self.block(body, new_body, k, end)
                self.migrated += 1
                nxt, comments = end + 1, list(self.comments(body[end]))
            if after:
                item = item.with_changes(leading_lines=[*after, *item.leading_lines])
            out.append(item)
            after, k = comments, nxt
        if after:
            return node.with_changes(body=out, footer=[*after, *node.footer])
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
        if opt is None:
            return _arguments_refusal(call)
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
                if m is not None and _toggling(m):
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
        if self.shadowed is not None and not self.form(recv, True)[0]:
            return (
                "an override of toggle_optimizer that may return None needs `with toggleshim.toggle(...)`, and "
                f"{self.shadowed}"
            )
        for expr in (opt, recv):
            if _ref(expr) is None:
                return (
                    f"`{_code(expr).strip()}` may not be the same object at the untoggle (allowed: a name, an "
                    "attribute chain on a name, a subscript by an int literal)"
                )
        escape = next(filter(None, (_escape(s) for s in inside)), None)
        if escape is not None:
            return f"{escape} between the toggle and the untoggle (a block would step and untoggle there)"
        rebound = _rebinds(inside, [opt, recv])
        if rebound is not None:
            return rebound
        for expr in (opt, recv):
            first = _root(expr)
            if first is not None and first in self.declared:
                kind, line = self.declared[first]
                return (
                    f"`{first}` is declared {kind} at line {line}: a function called between the toggle and the "
                    "untoggle may rebind it"
                )
        return None

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
        bindings = bool(self.scopes) and isinstance(self.scopes[-1], cst.FunctionDef)
        inside = list(range(i + 1, end))
        carried_front: list[cst.EmptyLine] = []
        carried_back: list[cst.EmptyLine] = []  # the step's comments (the untoggle's go after the block)
        # zero_grad: the block's entry calls it right after the toggle; a first `X.zero_grad()` may
        # move there when only inert lines stand before it.
        zero_grad = False
        forward = "forward-reads-no-grad" in self.assume
        for pos, k in enumerate(inside):
            if _zero_grad_line(body[k], key, "torch2-defaults" in self.assume):
                if all(
                    _inert(body[j], protected, bindings) or (forward and not _touches_gradients(body[j]))
                    for j in inside[:pos]
                ):
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
                # ... and no other line may step X (the block refuses a step inside a stepping block)
                if all(_inert(body[j], protected, bindings) for j in inside[pos + 1 :]) and not any(
                    _steps(body[j]) for j in inside if j != k
                ):
                    step = True
                    carried_back = list(self.comments(body[k])) + carried_back
                    inside.remove(k)
                break
        stmts: list[Any] = [new_body[k] for k in inside] or [cst.SimpleStatementLine([cst.Pass()])]
        if carried_front:
            first = stmts[0]
            stmts[0] = first.with_changes(leading_lines=[*carried_front, *first.leading_lines])
        flags = [name for name, on in (("zero_grad", zero_grad), ("step", step)) if not on]
        plain, outside = self.form(recv, bool(flags))
        space = cst.SimpleWhitespace(" ")
        if plain:
            self.plain += 1
            self.outside |= outside
        if flags:
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
        if not plain:  # `toggleshim.toggle(R, X, ...)`: the module's own toggle_optimizer, whatever it returns
            self.through += 1
            func = cst.Attribute(value=cst.Name("toggleshim"), attr=cst.Name("toggle"))
            receiver = cst.Arg(recv, comma=cst.Comma(whitespace_after=space))
            call = call.with_changes(func=func, args=[receiver, *call.args])
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


# isort's and ruff's default sections, in order
_FUTURE, _STDLIB, _THIRD_PARTY, _FIRST_PARTY, _LOCAL = range(5)
_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def _first_party(path: str) -> Callable[[str], bool]:
    """Whether a top-level module name is first-party for the file at ``path``, as ruff's defaults
    decide it: the file's own top-level package, or a package or module found in the project root
    (the nearest directory above the file holding pyproject.toml, setup.py, setup.cfg or .git; else
    the current directory) or in its ``src``."""
    here = os.path.dirname(os.path.abspath(path))
    package = None
    folder = here
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        package, folder = os.path.basename(folder), os.path.dirname(folder)
    root = here
    while not any(os.path.exists(os.path.join(root, m)) for m in _PROJECT_MARKERS):
        parent = os.path.dirname(root)
        if parent == root:
            root = os.getcwd()
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
        if start < len(body):
            after = body[start]
            blank = 2 if isinstance(after, (cst.FunctionDef, cst.ClassDef)) else 1
            body[start] = after.with_changes(leading_lines=[*[cst.EmptyLine()] * blank, *after.leading_lines])
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
    if not _load_libcst():
        raise ImportError(_INSTALL_HINT)
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
    untouched or fully rewritten). The temporary file gets the original's owner, group and permission
    bits before it takes its place; when they cannot be given (a file of another user or group), the
    file is left unchanged and the error says why. A symlink stays a symlink (its target is written)."""
    target = os.path.realpath(path)
    st = os.stat(target)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".toggleshim-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        made = os.stat(tmp)
        if hasattr(os, "chown") and (made.st_uid, made.st_gid) != (st.st_uid, st.st_gid):
            try:  # before chmod: a chown may clear the set-id bits
                os.chown(tmp, st.st_uid, st.st_gid)
            except PermissionError as exc:
                raise PermissionError(
                    exc.errno,
                    f"the file belongs to {st.st_uid}:{st.st_gid} (user:group) and a rewritten copy could not be "
                    f"given them ({exc.strerror}); rewriting it would change its owner",
                ) from exc
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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


def _parser(prog: str = "toggleshim") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{prog} migrate",
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
    parser.add_argument(
        "--assume",
        action="append",
        default=[],
        choices=sorted(ASSUMPTIONS),
        metavar="NAME",
        help="take an opt-in assumption (repeatable; off by default): "
        + "; ".join(f"{name}: {text}" for name, text in ASSUMPTIONS.items()),
    )
    parser.set_defaults(mode="diff")
    return parser


# Exit status when the reader of our output went away (``| head``): what a shell reports for a
# process killed by SIGPIPE (128 + 13), as `cat` or `git diff` would be.
EXIT_CLOSED_PIPE = 141


def main(argv: list[str], prog: str = "toggleshim") -> int:
    """``toggleshim migrate``; returns the exit code. ``prog``: how the program was called (usage lines)."""
    try:
        args = _parser(prog).parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    if not _load_libcst():
        sys.stderr.write(f"toggleshim migrate: {_INSTALL_HINT}\n")
        return 2
    try:
        files = _python_files(args.paths)
    except _UsageError as exc:
        sys.stderr.write(f"toggleshim migrate: {exc}\nnothing was changed\n")
        return 2
    try:
        code = _run(files, args.mode, frozenset(args.assume))
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        return closed_pipe()
    return code


def closed_pipe() -> int:
    """The reader of our output went away (``| head``): stop quietly, with :data:`EXIT_CLOSED_PIPE`.
    Python would flush the buffered rest at exit and print a traceback about it; the standard streams
    go to devnull instead. (``check`` uses it too.)"""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    return EXIT_CLOSED_PIPE


# What a `with R.toggle_optimizer(X)` block relies on and the run cannot see (docs/migrate.md)
_ASSUMED = (
    "toggleshim migrate: assumed: no class outside these files{bases} overrides toggle_optimizer without "
    "returning super().toggle_optimizer(...)'s result (a subclass defined elsewhere{skipped}); where one does, "
    'rewrite its blocks as `with toggleshim.toggle(self, opt):` (docs/migrate.md, "Overrides")\n'
)


def _run(files: list[str], mode: str, assume: frozenset[str] = frozenset()) -> int:
    """Process every file (one that cannot be processed is reported, the others go on); exit code.
    Two passes: every file's classes are indexed first (an override may be in any file of the run),
    then each file is rewritten."""
    failed = findings = changed = migrated = checked = plain = 0
    outside: set[str] = set()
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
            sys.stdout.write(_diff(result))
            sys.stdout.flush()  # a closed pipe shows here, not at exit
        changed += 1  # only what was written (or shown)
        migrated += n
        plain += result.plain
        outside |= result.outside
    total = f"{len(files)} file{'s' * (len(files) != 1)}"
    unread = f"{failed} could not be processed (see above)" if failed else ""
    if mode == "check":
        if checked == 0:
            sys.stderr.write(f"toggleshim migrate --check: nothing checked: {failed} of {total} could not be read\n")
        else:
            sys.stderr.write(
                f"toggleshim migrate --check: {findings} statement toggle{'s' * (findings != 1)} not exception-safe "
                f"in {checked} file{'s' * (checked != 1)} checked" + (f"; {unread}" if unread else "") + "\n"
            )
        return 1 if findings or failed else 0
    if plain:
        named = sorted(outside)
        listed = ", ".join(named[:3]) + (", ..." if len(named) > 3 else "")
        bases = f" (nor the bases from outside: {listed})" if named else ""
        skipped = ", or in a file that could not be processed" if failed else ""
        sys.stderr.write(_ASSUMED.format(bases=bases, skipped=skipped))
    verb = "rewrote" if mode == "write" else "would rewrite"
    sys.stderr.write(
        f"toggleshim migrate: {verb} {changed} of {total} ({migrated} span{'s' * (migrated != 1)})"
        + (f"; {unread}" if unread else "")
        + "\n"
    )
    return 1 if failed else 0
