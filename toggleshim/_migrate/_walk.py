"""A walk over one file's tree for a rewrite of it, in either direction: the scopes (``def`` and
``class``) around the node walked, the class a method's ``self`` is of, the names declared
``global`` or ``nonlocal``, and a rebuild that keeps every untouched subtree the very same object
(so it prints byte for byte)."""

from __future__ import annotations

import dataclasses
from typing import Any

import libcst as cst

from toggleshim._migrate._program import _IDENTITY_DECORATORS, _Class, _Program, _super_toggle
from toggleshim._migrate._syntax import _TOGGLE, _method_call, _nodes, _ref, _root, _targets, _toggling


class _Walker:
    """What both rewrites walk with; a subclass says what a statement list becomes."""

    def __init__(self, module: cst.Module, positions: Any, program: _Program) -> None:
        self.module = module
        self.positions = positions
        self.program = program
        self.scopes: list[cst.FunctionDef | cst.ClassDef] = []  # the defs and classes around the walk
        # `global x` / `nonlocal x` anywhere in the file: a function declaring it may rebind `x` when
        # called from inside a span or a block, where no binding form is visible.
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

    def walk(self, node: cst.CSTNode, outer: str | None) -> cst.CSTNode:
        """``node`` rewritten; ``outer``: what toggle is open around it (None: none)."""
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self.scopes.append(node)
            try:
                return self.rebuild(node, lambda child: self.walk(child, outer))
            finally:
                self.scopes.pop()
        if isinstance(node, (cst.Module, cst.IndentedBlock)):
            return self.statement_list(node, outer)
        inner = self.visit(node, outer)
        return self.rebuild(node, lambda child: self.walk(child, inner))

    def visit(self, node: cst.CSTNode, outer: str | None) -> str | None:
        """Look at ``node`` before its children are walked; what is open around them."""
        if isinstance(node, cst.With):
            for item in node.items:
                found = _method_call(item.item)
                if found is not None and _toggling(found):
                    return f"inside the toggle block at line {self.line(node)}"
        return outer

    def statement_list(self, node: cst.Module | cst.IndentedBlock, outer: str | None) -> cst.CSTNode:
        raise NotImplementedError

    def rebuild(self, node: cst.CSTNode, fn: Any) -> cst.CSTNode:
        """Children first; ``node`` is replaced only when a child changed."""
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
        """The class whose method the walk is in, when the receiver is that method's ``self`` (its
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

    def declared_refusal(self, exprs: tuple[cst.BaseExpression, ...], where: str) -> str | None:
        """Why an expression may be rebound unseen: its first name is declared global or nonlocal."""
        for expr in exprs:
            first = _root(expr)
            if first is not None and first in self.declared:
                kind, line = self.declared[first]
                return f"`{first}` is declared {kind} at line {line}: a function called {where} may rebind it"
        return None
