"""The program: the classes of every file of the run, how they inherit from one another, and which
of them override ``toggle_optimizer`` in a way a ``with`` can use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from toggleshim._flavours import FLAVOURS
from toggleshim._migrate._syntax import _TOGGLE, _code, _escape, _method_call, _nodes, _ref, _targets

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
# Where Lightning defines LightningModule (Lightning 1.x: core/lightning.py). A class of the run by that
# name in such a file is Lightning's own (a vendored copy, Lightning's source in the run): the class
# the patch is for, whose toggle_optimizer every block can use; its own returns None (issue 38).
_LIGHTNING_MODULES = frozenset(
    tuple(f"{flavour.name}{sub}".split(".")) for flavour in FLAVOURS for sub in (".core.module", ".core.lightning")
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
    drops: int | None = None  # the line of a ``super().toggle_optimizer(...)`` whose toggle it never returns
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


def _own_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The nodes of a function's own code: nested ``def``, ``lambda`` and ``class`` bodies left out."""
    for child in node.children:
        if not isinstance(child, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            yield child
            yield from _own_nodes(child)


def _dropped_toggle(node: cst.FunctionDef) -> cst.CSTNode | None:
    """The statement ``super().toggle_optimizer(...)`` of an override that drops its result: the call
    is a statement of its own and the override returns no value (no ``return`` but a bare one or
    ``return None``, no ``yield``). ``with self.toggle_optimizer(...)`` then gets None."""
    dropped = None
    for n in _own_nodes(node):
        if isinstance(n, cst.Return) and not (n.value is None or _code(n.value).strip() == "None"):
            return None
        if isinstance(n, (cst.Yield, cst.Await)):
            return None
        if dropped is None and isinstance(n, cst.Expr) and _super_toggle(n.value) is not None:
            dropped = n
    return dropped


def _describe_class(path: str, node: cst.ClassDef, positions: Any) -> _Class:
    info = _Class(path, node.name.value, int(positions[node].start.line), node)
    for stmt in node.body.body:
        if isinstance(stmt, cst.FunctionDef):
            if stmt.name.value == _TOGGLE:
                info.toggle, info.forwards = _toggle_kind(stmt)
                dropped = _dropped_toggle(stmt)
                info.drops = None if dropped is None else int(positions[dropped].start.line)
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
        parts = _module_parts(path)
        classes: list[_Class] = []
        imports = _Imports()
        for n in _nodes(module):
            if isinstance(n, cst.ClassDef):
                info = _describe_class(path, n, positions)
                if info.name == "LightningModule" and any(
                    tuple(parts[-len(where) :]) == where for where in _LIGHTNING_MODULES
                ):
                    info.toggle, info.forwards, info.drops = None, False, None  # Lightning's own: _LIGHTNING_MODULES
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
        self.parts[path] = parts
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
        if not level and f"{dotted}.{attr}" in _LIGHTNING_BASES:
            files = []  # Lightning's LightningModule, also where Lightning's source is in the run
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

    def dropping(self, cls: _Class) -> list[_Class]:
        """The classes whose ``toggle_optimizer`` a ``with self.toggle_optimizer(...)`` in a method of
        ``cls`` may call that drop the toggle their ``super()`` made (the ``with`` then gets None)."""
        return sorted((c for c in self.relevant(cls)[0] if c.drops is not None), key=lambda c: (c.path, c.line))
