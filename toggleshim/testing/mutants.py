"""Planted bugs: how a shim could be wrong, and how a Lightning release could change toggling.

Used to *measure* the property suite and ``python -m toggleshim check``: each mutant must make them
fail (``scripts/mutation_score.py``), and the unaltered code must pass.

* ``LIGHTNING``: replacements for Lightning's ``toggle_optimizer`` / ``untoggle_optimizer`` that look
  exactly like a new release's methods (same name, module and signature), so the shim accepts them.
* ``SHIM``: bugs planted in functions of ``toggleshim/_toggle.py`` (:class:`Edit`, matched on the
  syntax tree), compiled into a module that takes the place of the real one (every exit path, every
  flag, nesting, failing zero_grad/step, the fast path).
"""

from __future__ import annotations

import ast
import copy
import importlib
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from toggleshim._flavours import NAMES

__all__ = ["LIGHTNING", "SHIM", "Edit", "apply", "mutated_source_tree"]


def _params(opt: Any) -> list[Any]:
    return [p for g in opt.param_groups for p in g["params"]]


def _is(opt: Any, optimizer: Any) -> bool:
    return opt is optimizer or opt is getattr(optimizer, "_optimizer", None)


# -- Lightning releases that changed toggling -------------------------------------------------


def _toggle(
    keep: Callable[[Any, bool, bool], bool] | None = None, record: bool = True, freeze: bool = True
) -> Callable[[Any, Any], None]:
    """Lightning's toggle, with one thing changed: ``keep(param, recorded, shared)`` for the toggled
    optimizer's parameters, or no freezing, or no record."""

    def toggle_optimizer(self: Any, optimizer: Any) -> None:
        state: dict[Any, bool] = {}
        for opt in self.trainer.optimizers:
            for p in _params(opt):
                if p not in state:
                    state[p] = p.requires_grad
                    if freeze:
                        p.requires_grad = False
        others = {id(p) for o in self.trainer.optimizers if not _is(o, optimizer) for p in _params(o)}
        for p in _params(optimizer):
            p.requires_grad = keep(p, state[p], id(p) in others) if keep else state[p]
        self._param_requires_grad_state = state if record else {}

    return toggle_optimizer


def _untoggle(restore: str = "others") -> Callable[[Any, Any], None]:
    """Lightning's untoggle restoring ``"others"`` (the real one), ``"nothing"``, ``"all"`` (its own
    parameters too) or ``"unfreeze"`` (everything set trainable)."""

    def untoggle_optimizer(self: Any, optimizer: Any) -> None:
        state = self._param_requires_grad_state
        for opt in self.trainer.optimizers:
            if restore == "nothing" or (restore == "others" and _is(opt, optimizer)):
                continue
            for p in _params(opt):
                if restore == "unfreeze":
                    p.requires_grad = True
                elif p in state:
                    p.requires_grad = state[p]
        self._param_requires_grad_state = {}

    return untoggle_optimizer


LIGHTNING: dict[str, dict[str, Callable[[Any, Any], None]]] = {
    "toggle unfreezes user-frozen parameters": {"toggle_optimizer": _toggle(keep=lambda p, rec, sh: True)},
    "toggle freezes shared parameters": {"toggle_optimizer": _toggle(keep=lambda p, rec, sh: rec and not sh)},
    "toggle freezes nothing": {"toggle_optimizer": _toggle(freeze=False)},
    "toggle keeps no record": {"toggle_optimizer": _toggle(record=False)},
    "untoggle restores nothing": {"untoggle_optimizer": _untoggle("nothing")},
    "untoggle unfreezes everything": {"untoggle_optimizer": _untoggle("unfreeze")},
    "untoggle restores the toggled optimizer too": {"untoggle_optimizer": _untoggle("all")},
}


# -- shim bugs (edits of functions of _toggle.py) ------------------------------------------------


@dataclass(frozen=True)
class Edit:
    """A bug planted in one function of ``toggleshim/_toggle.py``: in ``function`` (a qualified name),
    the statements (or the expression) ``old`` become ``new``.

    Matched on the syntax tree, not the text: comments, formatting, and every other function of the
    module may change without touching the mutant; it stops applying (a clear error) only when the
    code it plants its bug in changes. ``old`` must occur exactly once in the function.
    """

    function: str
    old: str
    new: str


# A bug that skips an untoggle also drops the block's exit guard (``self._guard = None``): the guard
# alone would close the block a moment later (when the ``with`` statement lets go of ``__exit__``), so
# the bug would not be the one named.
_LEAVE_ON_ERROR = """
if exc_type is None:
    self._leave()
else:
    _quietly(self._leave, retry=False)
"""
_STEP = """
try:
    if exc_type is None and self._step:
        if self._stepped:
            raise _double_step(optimizer)
        optimizer.step()
except BaseException:
    _quietly(self._leave, retry=False)
    raise
"""
_FLAT_CHECK = """(
    len(now) == len(layout)
    and all(map(is_, now, layout))
    and type(record) is dict
    and len(record) == len(managed)
    and all(map(is_, record, managed))
    and all(map(is_, record.values(), vals))
)"""
_SYNC_EXIT = "self._sync_exit.pop()(None, None, None)"



def _changing(function: str, old: str, part: str, by: str) -> Edit:
    """The edit of ``old`` in which its ``part`` (which must occur in it) becomes ``by``."""
    if part not in old:
        raise ValueError(f"{part!r} is not in {old!r}")
    return Edit(function, old, old.replace(part, by))


SHIM: dict[str, Edit] = {
    "step on exception": Edit("Toggle._exit", "exc_type is None and self._step", "self._step"),
    "step ignores the step flag": Edit("Toggle._exit", "exc_type is None and self._step", "exc_type is None"),
    "no zero_grad on entry": Edit(
        "Toggle.__enter__", "if self._zero_grad:\n    self._optimizer.zero_grad()",
        "if False:\n    self._optimizer.zero_grad()",
    ),
    "zero_grad ignores the flag": Edit(
        "Toggle.__enter__", "if self._zero_grad:\n    self._optimizer.zero_grad()",
        "if True:\n    self._optimizer.zero_grad()",
    ),
    "exceptions swallowed": Edit(
        "Toggle._exit", "self._optimizer = None\nreturn False", "self._optimizer = None\nreturn exc_type is not None"
    ),
    "no untoggle on exception": _changing(
        "Toggle._exit", _LEAVE_ON_ERROR, "_quietly(self._leave, retry=False)", "self._guard = None"
    ),
    "no untoggle when zero_grad fails": Edit(
        "Toggle.__enter__", "_quietly(self._leave, retry=False)\nraise", "self._guard = None\nraise"
    ),
    "no untoggle when step fails": _changing(
        "Toggle._exit", _STEP, "    _quietly(self._leave, retry=False)\n    raise", "    self._guard = None\n    raise"
    ),
    "a failing untoggle replaces the body's exception": _changing(
        "Toggle._exit", _LEAVE_ON_ERROR, "_quietly(self._leave, retry=False)", "self._leave()"
    ),
    "an interrupt during cleanup is dropped": Edit(
        "_quietly", "contextlib.suppress(Exception)", "contextlib.suppress(BaseException)"
    ),
    "flat exit restores nothing": Edit("Toggle._untoggle_flat", "_assign(restore(managed), restore(vals))", "pass"),
    "flat exit leaves the record": Edit("Toggle._untoggle_flat", "module.__dict__[_RECORD] = {}", "pass"),
    "nesting is Lightning's (flat)": Edit(
        "_toggle_optimizer", "t._nested = nested = bool(stack)", "t._nested = nested = False"
    ),
    "nested toggle from the frozen state": Edit(
        "_toggle_optimizer", "t._vals = user = stack[-1]._user_view(managed, vals)", "t._vals = user = vals"
    ),
    "nested exit restores nothing": Edit("Toggle._untoggle_nested", "_assign(self._managed, self._entry)", "pass"),
    "toggle freezes nothing (statement form does nothing)": Edit(
        "_toggle_optimizer", "param.requires_grad = False", "pass"
    ),
    "toggle reuses a stale record": Edit("_toggle_optimizer", "vals != plan.last_vals", "plan.last_record is None"),
    "toggle freezes the toggled optimizer too": Edit(
        "_Plan.__init__", "_picker([i for i, key in enumerate(order) if key not in own])",
        "_picker(list(range(len(order))))",
    ),
    "untoggle skips shared parameters": Edit(
        "_Plan.__init__", "_picker([i for i, key in enumerate(order) if key in restored])",
        "_picker([i for i, key in enumerate(order) if key in restored and key not in own])",
    ),
    "cached plan ignores which optimizer is toggled": Edit(
        "_toggle_optimizer", "key = _plan_key(optimizer, inner)", "key = 0"
    ),
    "cached plan ignores in-place layout edits": Edit(
        "_toggle_optimizer", "cached is None or len(layout) != len(cached) or not all(map(is_, layout, cached))",
        "cached is None or len(layout) != len(cached)",
    ),
    "flat exit ignores edits made inside the block": Edit("Toggle._untoggle_flat", "now = _read(opts)", "now = layout"),
    "flat exit restores the values found at the toggle": _changing(
        "Toggle._untoggle_flat", _FLAT_CHECK, "and all(map(is_, record.values(), vals))", "and True"
    ),
    "flat exit ignores edits of the record's keys": _changing(
        "Toggle._untoggle_flat", _FLAT_CHECK, "and all(map(is_, record, managed))\n", ""
    ),
    "flat exit trusts a dict subclass": _changing(
        "Toggle._untoggle_flat", _FLAT_CHECK, "type(record) is dict", "isinstance(record, dict)"
    ),
    "statement untoggle inside a block ignored": Edit(
        "_untoggled", "top._phase == _MADE and _same(top._optimizer, optimizer)", "False"
    ),
    "the exit bypasses an overridden untoggle_optimizer": Edit(
        "Toggle._leave",
        'state is not None and self._phase != _CLOSED and overrides(module, "untoggle_optimizer")', "False",
    ),
    "a step inside a block goes unnoticed": Edit(
        "Toggle._exit", "if self._stepped:\n    raise _double_step(optimizer)",
        "if False:\n    raise _double_step(optimizer)",
    ),
    "a block inside a statement toggle is Lightning's flat one": Edit(
        "Toggle.__enter__", "self._outer is not None", "False"
    ),
    "a statement toggle keeps everything after its untoggle": Edit(
        "_untoggled", "flat is not None and flat._phase == _MADE", "False"
    ),
    "block ignores sync_grad": Edit(
        "_toggle_optimizer", 'sync = None if sync_grad else getattr(trainer.strategy, "block_backward_sync", None)',
        "sync = None",
    ),
    "sync never resumed": Edit("Toggle._close", _SYNC_EXIT, "self._sync_exit.pop()"),
    "a later refused write replaces the first": Edit("_assign", "error = _first(error, e)", "error = e"),
    "a failing sync exit is called again": Edit(  # retried by the cleanup (the bug before this fix)
        "Toggle._close", _SYNC_EXIT, "self._sync_exit[-1](None, None, None)\nself._sync_exit.pop()"
    ),
}


def _function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    """The definition of ``qualname`` (``Class.method`` or ``function``) in ``tree``, wherever it sits
    (inside ``if`` blocks too); the last one when it is defined twice."""
    found: list[ast.FunctionDef] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef)):
                name = prefix + child.name
                if name == qualname and isinstance(child, ast.FunctionDef):
                    found.append(child)
                visit(child, name + ".")
            elif not isinstance(child, (ast.expr, ast.AsyncFunctionDef)):
                visit(child, prefix)

    visit(tree, "")
    if not found:
        raise ValueError(f"no function {qualname} in _toggle.py")
    return found[-1]


def _shape(nodes: Sequence[ast.AST]) -> list[str]:
    return [ast.dump(n, annotate_fields=False, include_attributes=False) for n in nodes]


_N = TypeVar("_N", bound=ast.AST)


def _placed(node: _N, where: ast.AST) -> _N:
    """``node`` and everything in it at the source position of ``where`` (the code it replaces)."""
    for child in ast.walk(node):
        for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if attr in child._attributes:
                setattr(child, attr, getattr(where, attr))
    return node


def _planted(tree: ast.Module, edit: Edit) -> int:
    """Replace ``edit.old`` by ``edit.new`` inside its function in ``tree``; how many places matched."""
    function = _function(tree, edit.function)
    old = ast.parse(textwrap.dedent(edit.old).strip())
    new = ast.parse(textwrap.dedent(edit.new).strip())
    if all(len(t.body) == 1 and isinstance(t.body[0], ast.Expr) for t in (old, new)):  # expressions
        want = _shape([old.body[0].value])[0]  # type: ignore[attr-defined]
        replacement: ast.expr = new.body[0].value  # type: ignore[attr-defined]
        hits = 0

        class Swap(ast.NodeTransformer):
            def visit(self, node: ast.AST) -> ast.AST:
                nonlocal hits
                if isinstance(node, ast.expr) and _shape([node])[0] == want:
                    hits += 1
                    return _placed(copy.deepcopy(replacement), node)
                result: ast.AST = super().visit(node)
                return result

        Swap().visit(function)
        return hits
    want_stmts = _shape(old.body)
    hits = 0
    for node in ast.walk(function):  # every list of statements: bodies, else branches, handlers, finally
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                continue
            n, i = len(want_stmts), 0
            while i <= len(stmts) - n:  # every occurrence counts (more than one: the mutant is refused)
                if _shape(stmts[i:i + n]) == want_stmts:
                    stmts[i:i + n] = [_placed(stmt, stmts[i]) for stmt in copy.deepcopy(new.body)]
                    hits += 1
                    i += len(new.body)
                else:
                    i += 1
    return hits


def mutated_source_tree(name: str) -> ast.Module:
    """``_toggle.py``'s syntax tree with the bug ``name`` planted."""
    from toggleshim import _toggle

    tree = ast.parse(Path(_toggle.__file__).read_text())
    hits = _planted(tree, SHIM[name])
    if hits != 1:
        raise ValueError(
            f"mutant {name!r} matches {hits} places of {SHIM[name].function} in _toggle.py (exactly 1 needed): "
            "update toggleshim/testing/mutants.py"
        )
    return ast.fix_missing_locations(tree)


def _apply_lightning(name: str) -> None:
    import toggleshim

    toggleshim.uninstall()
    for flavour in NAMES:
        try:
            cls = importlib.import_module(flavour).LightningModule
        except ImportError:
            continue
        for method, fn in LIGHTNING[name].items():
            clone = types.FunctionType(fn.__code__, fn.__globals__, method, fn.__defaults__, fn.__closure__)
            clone.__qualname__ = f"LightningModule.{method}"  # what a new release's method looks like
            clone.__module__ = f"{flavour}.core.module"
            setattr(cls, method, clone)
    with warnings.catch_warnings():  # the gate warns of unverified toggle code: planted here on purpose
        warnings.simplefilter("ignore", toggleshim.ToggleshimWarning)
        toggleshim.install()


def _apply_shim(name: str) -> None:
    import toggleshim
    from toggleshim import _patch, _toggle

    tree = mutated_source_tree(name)
    mutated = types.ModuleType("toggleshim._toggle")
    mutated.__file__ = _toggle.__file__
    exec(compile(tree, _toggle.__file__, "exec"), mutated.__dict__)
    sys.modules["toggleshim._toggle"] = mutated
    _patch._toggle = mutated  # type: ignore[attr-defined]
    _patch.Toggle = mutated.Toggle  # type: ignore[attr-defined]
    _patch._untoggled = mutated._untoggled  # type: ignore[attr-defined]
    setattr(toggleshim, "Toggle", mutated.Toggle)  # noqa: B010  (mypy: a class cannot be assigned to)
    setattr(toggleshim, "toggle", mutated.toggle)  # noqa: B010
    toggleshim.uninstall()
    toggleshim.install()


def apply(name: str) -> None:
    """Plant the mutant ``name`` (a key of :data:`LIGHTNING` or :data:`SHIM`) in this process."""
    if name in LIGHTNING:
        _apply_lightning(name)
    elif name in SHIM:
        _apply_shim(name)
    else:
        raise KeyError(f"unknown mutant {name!r}; known: {sorted(LIGHTNING) + sorted(SHIM)}")
