"""What the rewrite reads in LibCST's tree, in both directions: expressions that name the same object
(``_ref``), toggle calls, the statements of a span, what leaves it and what rebinds a name."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import libcst as cst

_TOGGLE, _UNTOGGLE = "toggle_optimizer", "untoggle_optimizer"
# Calls that toggle or untoggle: a span holding one of them would nest, and a block nests
# differently from Lightning's statement nesting (README, "Semantics": nesting).
_TOGGLE_FAMILY = frozenset({_TOGGLE, _UNTOGGLE, "toggled_optimizer", "toggle_model"})
# Names whose use in a span could rebind the optimizer expression behind the tool's back.
_REBINDERS = frozenset({"setattr", "delattr", "vars", "globals", "locals", "exec", "eval", "__dict__"})


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


def _escape(node: cst.CSTNode, in_loop: bool = False, suspends: bool = True) -> str | None:
    """What in ``node`` would leave the span other than by an exception, if anything; ``suspends``:
    also what suspends it (a yield, an await)."""
    if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
        return None  # a new scope: its returns and yields are its own
    if isinstance(node, cst.Return):
        return "a return"
    if suspends and isinstance(node, (cst.Yield, cst.Await)):
        return f"{'a yield' if isinstance(node, cst.Yield) else 'an await'}"
    if suspends and isinstance(node, (cst.For, cst.With, cst.CompFor)) and node.asynchronous is not None:
        return "an async loop or block (it awaits)"
    if isinstance(node, (cst.Break, cst.Continue)) and not in_loop:
        return f"a {'break' if isinstance(node, cst.Break) else 'continue'}"
    for child in node.children:
        # inside a loop's body break/continue stay in it; its else clause belongs to the outside
        loop_body = isinstance(node, (cst.For, cst.While)) and child is node.body
        found = _escape(child, in_loop or loop_body, suspends)
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


def _same(a: cst.BaseExpression | None, b: cst.BaseExpression | None) -> bool:
    """The same expression, up to whitespace (only used on expressions ``_ref`` accepts, or to refuse)."""
    return a is not None and b is not None and "".join(_code(a).split()) == "".join(_code(b).split())


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


def _steps(stmt: cst.CSTNode) -> bool:
    """The statement may call a ``.step(...)`` anywhere in it (under a condition, in a loop, with a
    closure; X spelled another way, or an alias of it): a block that steps on exit too would refuse
    a second step of its optimizer, so X's last step stays in the body."""
    return any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "step"
        for n in _nodes(stmt)
    )
