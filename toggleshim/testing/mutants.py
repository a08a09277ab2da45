"""Planted bugs: how a shim could be wrong, and how a Lightning release could change toggling.

Used to *measure* the property suite and ``python -m toggleshim check``: each mutant must make them
fail (``scripts/mutation_score.py``), and the unaltered code must pass.

* ``LIGHTNING``: replacements for Lightning's ``toggle_optimizer`` / ``untoggle_optimizer`` that look
  exactly like a new release's methods (same name, module and signature), so the shim accepts them.
* ``SHIM``: source edits of ``toggleshim/_toggle.py``, compiled into a module that takes the place of
  the real one (every exit path, every flag, nesting, failing zero_grad/step, the fast path).
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toggleshim._flavours import NAMES

__all__ = ["LIGHTNING", "SHIM", "apply"]


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


# -- shim bugs (source edits of _toggle.py) ---------------------------------------------------

# Each is (text of _toggle.py, replacement). A bug that skips an untoggle also drops the block's
# exit guard (``self._guard = None``): the guard alone would close the block a moment later (when the
# ``with`` statement lets go of ``__exit__``), so the bug would not be the one named.
_EXIT = (
    "        try:\n"
    "            if exc_type is None and self._step:\n"
    "                if self._stepped:\n"
    "                    raise _double_step(optimizer)\n"
    "                optimizer.step()  # type: ignore[attr-defined]\n"
    "        except BaseException:\n"
    "            _quietly(self._leave, retry=False)  # step's error propagates, not one of the untoggle's\n"
    "            raise\n"
    "        # Already closed when an enclosing block that ended first unwound it (a generator holding a\n"
    "        # block): its untoggle is done, _close does nothing more.\n"
    "        if exc_type is None:\n"
    "            self._leave()\n"
    "        else:\n"
    "            _quietly(self._leave, retry=False)  # the body's exception propagates unchanged\n"
)
_BODY_ERROR_EXIT = "            _quietly(self._leave, retry=False)  # the body's exception propagates unchanged\n"
_STEP_ERROR_EXIT = (
    "            _quietly(self._leave, retry=False)  # step's error propagates, not one of the untoggle's\n"
)
_ZERO_GRAD = (
    "            if self._zero_grad:\n"
    "                self._optimizer.zero_grad()  # type: ignore[union-attr]\n"
)
_FLAT_CHECK = (
    "            and type(record) is dict  # not .__class__, which a subclass can fake\n"
    "            and len(record) == len(managed)\n"
    "            and all(map(is_, record, managed))\n"
    "            and all(map(is_, record.values(), vals))  # not ==: 1 == True, which Lightning's write refuses\n"
)

SHIM: dict[str, tuple[str, str]] = {
    "step on exception": (
        "            if exc_type is None and self._step:",
        "            if self._step:",
    ),
    "step ignores the step flag": (
        "            if exc_type is None and self._step:",
        "            if exc_type is None:",
    ),
    "no zero_grad on entry": (_ZERO_GRAD, _ZERO_GRAD.replace("if self._zero_grad:", "if False:")),
    "zero_grad ignores the flag": (_ZERO_GRAD, _ZERO_GRAD.replace("if self._zero_grad:", "if True:")),
    "exceptions swallowed": (
        "        return False  # never swallow\n",
        "        return exc_type is not None  # type: ignore[return-value]\n",
    ),
    "no untoggle on exception": (_EXIT, _EXIT.replace(_BODY_ERROR_EXIT, "            self._guard = None\n")),
    "no untoggle when zero_grad fails": (
        "        except BaseException:\n            _quietly(self._leave, retry=False)  # the error in flight "
        "propagates (an interrupt too)\n            raise\n",
        "        except BaseException:\n            self._guard = None\n            raise\n",
    ),
    "no untoggle when step fails": (_EXIT, _EXIT.replace(_STEP_ERROR_EXIT, "            self._guard = None\n")),
    "a failing untoggle replaces the body's exception": (
        _EXIT, _EXIT.replace(_BODY_ERROR_EXIT, "            self._leave()\n")
    ),
    "an interrupt during cleanup is dropped": (
        "    flight propagates unchanged; an interrupt during the cleanup still propagates.\"\"\"\n"
        "    with contextlib.suppress(Exception):\n",
        "    flight propagates unchanged; an interrupt during the cleanup still propagates.\"\"\"\n"
        "    with contextlib.suppress(BaseException):\n",
    ),
    "flat exit restores nothing": (
        "        _assign(restore(managed), restore(vals))\n",
        "        pass\n",
    ),
    "flat exit leaves the record": (
        "    module.__dict__[_RECORD] = {}\n",
        "    pass\n",
    ),
    "nesting is Lightning's (flat)": (
        "    t._nested = nested = bool(stack)\n",
        "    t._nested = nested = False\n",
    ),
    "nested toggle from the frozen state": (
        "    t._vals = user = stack[-1]._user_view(managed, vals)\n",
        "    t._vals = user = vals\n",
    ),
    "nested exit restores nothing": (
        "        _assign(self._managed, self._entry)\n",
        "        pass\n",
    ),
    "toggle freezes nothing (statement form does nothing)": (
        "                param.requires_grad = False\n",
        "                pass\n",
    ),
    "toggle reuses a stale record": (
        "        if vals != plan.last_vals:\n",
        "        if plan.last_record is None:\n",
    ),
    "toggle freezes the toggled optimizer too": (
        "        self.free = _picker([i for i, key in enumerate(order) if key not in own])",
        "        self.free = _picker(list(range(len(order))))",
    ),
    "untoggle skips shared parameters": (
        "        self.restore = _picker([i for i, key in enumerate(order) if key in restored])",
        "        self.restore = _picker([i for i, key in enumerate(order) if key in restored and key not in own])",
    ),
    "cached plan ignores which optimizer is toggled": (
        "    key = _plan_key(optimizer, inner)\n",
        "    key = 0\n",
    ),
    "cached plan ignores in-place layout edits": (
        "    if cached is None or len(layout) != len(cached) or not all(map(is_, layout, cached)):\n",
        "    if cached is None or len(layout) != len(cached):\n",
    ),
    "flat exit ignores edits made inside the block": (
        "        now = _read(opts)\n",
        "        now = layout\n",
    ),
    "flat exit restores the values found at the toggle": (
        _FLAT_CHECK,
        _FLAT_CHECK.replace("            and all(map(is_, record.values(), vals))", "            and True  #"),
    ),
    "flat exit ignores edits of the record's keys": (
        _FLAT_CHECK,
        _FLAT_CHECK.replace("            and all(map(is_, record, managed))\n", ""),
    ),
    "flat exit trusts a dict subclass": (
        _FLAT_CHECK,
        _FLAT_CHECK.replace("            and type(record) is dict", "            and isinstance(record, dict)"),
    ),
    "statement untoggle inside a block ignored": (
        "        if top._phase == _MADE and _same(top._optimizer, optimizer):\n",
        "        if False:\n",
    ),
    "the exit bypasses an overridden untoggle_optimizer": (
        "        if state is not None and self._phase != _CLOSED and overrides(module, \"untoggle_optimizer\"):\n",
        "        if False:\n",
    ),
    "a step inside a block goes unnoticed": (
        "                if self._stepped:\n",
        "                if False:\n",
    ),
    "a block inside a statement toggle is Lightning's flat one": (
        "            if self._outer is not None:\n                self._nest()\n",
        "            if False:\n                self._nest()\n",
    ),
    "a statement toggle keeps everything after its untoggle": (
        "    if flat is not None and flat._phase == _MADE:",
        "    if False:",
    ),
    "block ignores sync_grad": (
        '    sync = None if sync_grad else getattr(trainer.strategy, "block_backward_sync", None)\n',
        "    sync = None\n",
    ),
    "sync never resumed": (
        "                    self._sync_exit.pop()(None, None, None)\n",
        "                    self._sync_exit.pop()\n",
    ),
    "a later refused write replaces the first": (
        "# re-raised below, after the other writes\n            error = _first(error, e)\n",
        "# re-raised below, after the other writes\n            error = e\n",
    ),
    "a failing sync exit is called again": (  # retried by the cleanup (the bug before this fix)
        "                    self._sync_exit.pop()(None, None, None)\n",
        "                    self._sync_exit[-1](None, None, None)\n                    self._sync_exit.pop()\n",
    ),
}


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

    old, new = SHIM[name]
    source = Path(_toggle.__file__).read_text()
    if source.count(old) != 1:
        raise ValueError(f"mutant {name!r} no longer applies to _toggle.py: update toggleshim/testing/mutants.py")
    mutated = types.ModuleType("toggleshim._toggle")
    mutated.__file__ = _toggle.__file__
    exec(compile(source.replace(old, new), _toggle.__file__, "exec"), mutated.__dict__)
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
