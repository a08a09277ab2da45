"""Planted bugs: how a shim could be wrong, and how a Lightning release could change toggling.

Used to *measure* the property suite and ``python -m toggleshim check``: each mutant must make them
fail (``scripts/mutation_score.py``), and the unaltered code must pass.

* ``LIGHTNING``: replacements for Lightning's ``toggle_optimizer`` / ``untoggle_optimizer`` that look
  exactly like a new release's methods (same name, module and signature), so the shim accepts them.
* ``SHIM``: bugs planted in functions of the core (``toggleshim/_writes.py``, ``_toggle.py``,
  ``_block.py``; :class:`Edit`, matched on the syntax tree), compiled into a module that takes the
  place of the real one (every exit path, every flag, nesting, failing zero_grad/step, the fast path).
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


# -- shim bugs (edits of functions of the core) --------------------------------------------------

#: The modules of the core, in the order they import each other: a shim bug is planted in one of them.
CORE = ("_writes", "_ours", "_toggle", "_block")


@dataclass(frozen=True)
class Edit:
    """A bug planted in one function of the core (``toggleshim/<module>.py``, one of :data:`CORE`): in
    ``function`` (a qualified name), the statements (or the expression) ``old`` become ``new``.

    Matched on the syntax tree, not the text: comments, formatting, and every other function of the
    module may change without touching the mutant; it stops applying (a clear error) only when the
    code it plants its bug in changes. ``old`` must occur exactly once in the function.
    """

    function: str
    old: str
    new: str
    module: str = "_block"


# A bug that skips an untoggle also drops the block's exit guard (``self._guard = None``): the guard
# alone would close the block a moment later (when the ``with`` statement lets go of ``__exit__``), so
# the bug would not be the one named.
_LEAVE_ON_ERROR = """
if exc_type is None:
    self._leave()
else:
    quietly(self._leave, retry=False)
"""
_STEP = """
try:
    if exc_type is None and self._flags["step"]:
        if self._stepped:
            raise _double_step(_toggle._unwrap(optimizer), self._inner_block)
        self._stepped = None
        optimizer.step()
except BaseException:
    quietly(self._leave, retry=False)
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


def _changing(function: str, old: str, part: str, by: str, module: str = "_block") -> Edit:
    """The edit of ``old`` in which its ``part`` (which must occur in it) becomes ``by``."""
    if part not in old:
        raise ValueError(f"{part!r} is not in {old!r}")
    return Edit(function, old, old.replace(part, by), module)


SHIM: dict[str, Edit] = {
    "step on exception": Edit("Toggle._exit", 'exc_type is None and self._flags["step"]', 'self._flags["step"]'),
    "step ignores the step flag": Edit("Toggle._exit", 'exc_type is None and self._flags["step"]', "exc_type is None"),
    "no zero_grad on entry": Edit(
        "Toggle.__enter__", 'if flags["zero_grad"]:\n    self._optimizer.zero_grad()',
        "if False:\n    self._optimizer.zero_grad()",
    ),
    "zero_grad ignores the flag": Edit(
        "Toggle.__enter__", 'if flags["zero_grad"]:\n    self._optimizer.zero_grad()',
        "if True:\n    self._optimizer.zero_grad()",
    ),
    "exceptions swallowed": Edit(
        "Toggle._exit", _LEAVE_ON_ERROR + "return False", _LEAVE_ON_ERROR + "return exc_type is not None"
    ),
    "no untoggle on exception": _changing(
        "Toggle._exit", _LEAVE_ON_ERROR, "quietly(self._leave, retry=False)", "self._guard = None"
    ),
    "no untoggle when zero_grad fails": Edit(
        "Toggle.__enter__", "quietly(self._leave, retry=False)\nraise", "self._guard = None\nraise"
    ),
    "no untoggle when step fails": _changing(
        "Toggle._exit", _STEP, "    quietly(self._leave, retry=False)\n    raise", "    self._guard = None\n    raise"
    ),
    "a failing untoggle replaces the body's exception": _changing(
        "Toggle._exit", _LEAVE_ON_ERROR, "quietly(self._leave, retry=False)", "self._leave()"
    ),
    "an interrupt during cleanup is dropped": Edit(
        "quietly", "contextlib.suppress(Exception)", "contextlib.suppress(BaseException)", "_writes"
    ),
    "flat exit restores nothing": Edit("_Flat.undo", "restore(picks(managed), picks(vals))", "pass", "_toggle"),
    "flat exit leaves the record": Edit("_Flat.undo", "module.__dict__[RECORD] = {}", "pass", "_toggle"),
    "nesting is Lightning's (flat)": Edit("toggle", "not stack", "True", "_toggle"),
    "nested toggle from the frozen state": Edit(
        "toggle", "nested.vals = user = stack[-1].user_view(managed, vals)", "nested.vals = user = vals", "_toggle"
    ),
    "nested exit restores nothing": Edit("_Nested.undo", "restore(self.managed, self.entry)", "pass", "_toggle"),
    "toggle freezes nothing (statement form does nothing)": Edit("toggle", "plan.free(managed)", "()", "_toggle"),
    "toggle freezes the toggled optimizer too": Edit(
        "_Plan.__init__", "_picker([i for i, key in enumerate(order) if key not in own])",
        "_picker(list(range(len(order))))", "_toggle",
    ),
    "untoggle skips shared parameters": Edit(
        "_Plan.__init__", "_picker([i for i, key in enumerate(order) if key in restored])",
        "_picker([i for i, key in enumerate(order) if key in restored and key not in own])", "_toggle",
    ),
    "cached plan ignores which optimizer is toggled": Edit(
        "toggle", "key = _plan_key(optimizer, inner)", "key = 0", "_toggle"
    ),
    "cached plan ignores in-place layout edits": Edit(
        "toggle", "ids is None or len(layout) != len(ids) or ids != list(map(id, layout))",
        "ids is None or len(layout) != len(ids)", "_toggle",
    ),
    "flat exit ignores edits made inside the block": Edit("_Flat.undo", "now = _read(opts)", "now = layout", "_toggle"),
    "flat exit restores the values found at the toggle": _changing(
        "_Flat.undo", _FLAT_CHECK, "and all(map(is_, record.values(), vals))", "and True", "_toggle"
    ),
    "flat exit ignores edits of the record's keys": _changing(
        "_Flat.undo", _FLAT_CHECK, "and all(map(is_, record, managed))\n", "", "_toggle"
    ),
    "flat exit trusts a dict subclass": _changing(
        "_Flat.undo", _FLAT_CHECK, "type(record) is dict", "isinstance(record, dict)", "_toggle"
    ),
    "statement untoggle inside a block ignored": Edit(
        "untoggled", "not top.entered and same(top.optimizer, optimizer)", "False", "_toggle"
    ),
    "the exit bypasses an overridden untoggle_optimizer": Edit(
        "_Made.leave", 'None if self.done else users(self.module, "untoggle_optimizer")', "None", "_toggle"
    ),
    # the user's methods are what self.<name> resolves to (issue 35: a method set on the instance, a
    # wraps-wrapper of Lightning's method carrying its name, flags an override passes to super())
    "the exit skips an untoggle_optimizer set on the instance": Edit(
        "users", 'getattr(module, "__dict__", {}).get(name)', "None", "_ours"
    ),
    "a wrapper of Lightning's method is taken for Lightning's by its name": Edit(
        "users", "original_of(getattr(type(module), name, None)) is not None",
        'getattr(getattr(type(module), name, None), "__qualname__", "").startswith("LightningModule.")', "_ours"
    ),
    "toggle() drops the flags an override passes to super()": Edit(
        "_through_users", "block._flags = {**block._flags, **explicit}", "block._flags = {**_DEFAULTS, **explicit}"
    ),
    "a step inside a block goes unnoticed": Edit(
        "Toggle._exit", "if self._stepped:\n    raise _double_step(_toggle._unwrap(optimizer), self._inner_block)",
        "if False:\n    raise _double_step(_toggle._unwrap(optimizer), self._inner_block)",
    ),
    # the watch is ``step`` on the optimizer instance (torch's step hooks are stripped by torch 2.0 and 2.1's
    # first torch.compile): what `check`'s torch properties must see fail
    "the step watch never fires": Edit("Toggle._watch_steps", "toggle._stepped = True", "pass"),
    "a step watch stays on the optimizer": Edit("_unwatch", 'own.pop("step", None)', "pass"),
    "a block inside a statement toggle is Lightning's flat one": Edit(
        "_Flat.for_block", "self.outer is not None", "False", "_toggle"
    ),
    "a statement toggle keeps everything after its untoggle": Edit(
        "untoggled", "flat is not None and not flat.entered", "False", "_toggle"
    ),
    "block ignores sync_grad": Edit(
        "_toggle_optimizer",
        'sync = None if given["sync_grad"] else getattr(trainer.strategy, "block_backward_sync", None)', "sync = None",
    ),
    "sync never resumed": Edit("Toggle._close", _SYNC_EXIT, "self._sync_exit.pop()"),
    "a later refused write replaces the first": Edit("restore", "error = first(error, e)", "error = e", "_writes"),
    "a failing sync exit is called again": Edit(  # retried by the cleanup (the bug before this fix)
        "Toggle._close", _SYNC_EXIT, "self._sync_exit[-1](None, None, None)\nself._sync_exit.pop()"
    ),
    # the block steps the torch optimizer inside a LightningOptimizer: no precision plugin (16-bit
    # AMP's loss scaler), no loop hooks, no global step
    "the block steps around the LightningOptimizer": Edit(
        "Toggle._exit", "optimizer.step()", "_toggle._unwrap(optimizer).step()"
    ),
    "a toggle that cannot complete keeps its writes": Edit(
        "apply", "quietly(_rollback, module, params, olds, previous)", "pass", "_writes"
    ),
    "the fallback's blocks nest": Edit("refuse_nesting", "state is not None and state.fallback is not None", "False",
                                       "_toggle"),
    # only the block holds its exit's watch: freed with it in a garbage cycle, the callback never runs
    "the exit's watch is the block's alone": Edit("_guard", "_GUARDS.add(watch)", "pass"),
    "a block let go of while open stays open": Edit("_Open.__del__", "self._abandoned()", "pass"),

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
        raise ValueError(f"no function {qualname} in the module")
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


def _source(module: str) -> str:
    return Path(importlib.import_module(f"toggleshim.{module}").__file__ or "").read_text()


def mutated_source_tree(name: str) -> ast.Module:
    """The syntax tree of the core module ``SHIM[name].module`` with the bug ``name`` planted."""
    edit = SHIM[name]
    tree = ast.parse(_source(edit.module))
    hits = _planted(tree, edit)
    if hits != 1:
        raise ValueError(
            f"mutant {name!r} matches {hits} places of {edit.function} in {edit.module}.py (exactly 1 needed): "
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
    """Run the core afresh, the bug planted in its module, and make everything use it: each module of
    :data:`CORE` is executed again (the mutated one from its planted tree) as a new module object, in
    import order, so that each imports the new ones before it; then every name that another loaded
    module of toggleshim bound to a function, class or module of the old core is bound to the new one
    (``from toggleshim._block import Toggle`` in the package, ``_patch``, the harness)."""
    import toggleshim

    planted = SHIM[name].module
    old = {m: importlib.import_module(f"toggleshim.{m}") for m in CORE}
    new: dict[str, types.ModuleType] = {}
    for m in CORE:
        path = old[m].__file__ or ""
        tree = mutated_source_tree(name) if m == planted else ast.parse(_source(m))
        module = types.ModuleType(f"toggleshim.{m}")
        module.__file__ = path
        sys.modules[module.__name__] = module
        setattr(toggleshim, m, module)
        exec(compile(tree, path, "exec"), module.__dict__)
        new[m] = module
    replaced: dict[int, Any] = {}
    for m in CORE:
        replaced[id(old[m])] = new[m]
        for attr, value in vars(old[m]).items():
            fresh = getattr(new[m], attr, None)
            if fresh is not None and fresh is not value and isinstance(value, (type, types.FunctionType)):
                replaced[id(value)] = fresh
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] != "toggleshim" or module_name.removeprefix("toggleshim.") in CORE:
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in replaced:
                setattr(module, attr, replaced[id(value)])
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
