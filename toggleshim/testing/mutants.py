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

SHIM: dict[str, tuple[str, str]] = {
    "step on exception": (
        "if exc_type is None and self._step:",
        "if self._step:",
    ),
    "step ignores the step flag": (
        "if exc_type is None and self._step:",
        "if exc_type is None:",
    ),
    "no zero_grad on entry": (
        "            if self._zero_grad:\n                self._optimizer.zero_grad()",
        "            if False:\n                self._optimizer.zero_grad()",
    ),
    "zero_grad ignores the flag": (
        "            if self._zero_grad:\n                self._optimizer.zero_grad()",
        "            if True:\n                self._optimizer.zero_grad()",
    ),
    "exceptions swallowed": (
        "        return False  # never swallow",
        "        return exc_type is not None  # type: ignore[return-value]",
    ),
    "no untoggle on exception": (
        "        finally:\n            state = self._state\n",
        "        finally:\n            if exc_type is not None:\n"
        "                return False\n            state = self._state\n",
    ),
    "no untoggle when zero_grad fails": (
        "        except BaseException:\n            self._close(state)\n            raise",
        "        except BaseException:\n            raise",
    ),
    "no untoggle when step fails": (
        "        try:\n            if exc_type is None and self._step:\n"
        "                self._optimizer.step()  # type: ignore[union-attr]\n"
        "        finally:\n            state = self._state\n",
        "        if exc_type is None and self._step:\n"
        "            self._optimizer.step()  # type: ignore[union-attr]\n"
        "        if True:\n            state = self._state\n",
    ),
    "flat exit restores nothing": (
        "    for p, was in zip(restore, restore_vals):\n        p.requires_grad = was",
        "        pass",
    ),
    "flat exit leaves the record": (
        '    namespace["_param_requires_grad_state"] = {}',
        "    pass",
    ),
    "nesting is Lightning's (flat)": (
        "    stack = state.stack\n    plan = state.plans",
        "    stack: list[Any] = []\n    plan = state.plans",
    ),
    "nested toggle from the frozen state": (
        "        user = outer._user_view(plan, vals)",
        "        user = vals",
    ),
    "nested exit restores nothing": (
        "                for p, was in zip(plan.managed, self._entry):\n"
        "                    if p.requires_grad is not was:\n"
        "                        p.requires_grad = was",
        "                pass",
    ),
    "toggle only on entry (statement form does nothing)": (
        "    for p in free:  # as Lightning: every managed parameter but the toggled ones, frozen\n"
        "        p.requires_grad = False",
        "    pass",
    ),
    "a new plan's first toggle freezes nothing": (
        "            for p in plan.free:  # as Lightning: every managed parameter but the toggled ones, frozen\n"
        "                p.requires_grad = False",
        "            pass",
    ),
    "toggle reuses a stale record": (
        "        if vals != self.last_vals:",
        "        if self.last_vals is None:",
    ),
    "toggle freezes the toggled optimizer too": (
        "        free_idx = [i for i, mine in enumerate(own_mask) if not mine]",
        "        free_idx = list(range(len(own_mask)))",
    ),
    "untoggle skips shared parameters": (
        "        if o is not optimizer and o is not inner:\n            restored.update(id(p) for p in params)",
        "        if o is not optimizer and o is not inner:\n"
        "            restored.update(id(p) for p in params if id(p) not in own_ids)",
    ),
    "cached plan ignores in-place parameter edits": (
        "    if len(now) != len(seq) or not all(map(is_, now, seq)):\n        return now",
        "    if len(now) != len(seq):\n        return now",
    ),
    "flat exit ignores edits made inside the block": (
        "        now = _layout(opts, optimizer, inner)\n        if (",
        "        now = list(seq)\n        if (",
    ),
    "flat exit restores the values found at the toggle": (
        "            or last_record != record  # each parameter found, with an equal value\n"
        "            or not all(map(is_, record.values(), vals))  # the values: the very bools recorded, in order\n",
        "            or not last_record.keys() == record.keys()\n",
    ),
    "flat exit ignores edits of the record's keys": (
        "            or last_record != record  # each parameter found, with an equal value\n",
        "            or len(last_record) != len(record)\n",
    ),
    "nested view compares parameters by value": (
        "        if len(mine) != len(theirs) or not all(map(is_, mine, theirs)):",
        "        if mine != theirs:",
    ),
    "block ignores sync_grad": (
        '    sync = None if sync_grad else getattr(trainer.strategy, "block_backward_sync", None)',
        "    sync = None",
    ),
    "statement untoggle inside a block ignored": (
        "    if top._optimizer is optimizer or _unwrap(top._optimizer) is _unwrap(optimizer):\n        return top",
        "    if False:\n        return top",
    ),
}


def _apply_lightning(name: str) -> None:
    import toggleshim

    toggleshim.uninstall()
    for flavour in ("lightning.pytorch", "pytorch_lightning"):
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
    if source.count(old) < 1:
        raise ValueError(f"mutant {name!r} no longer applies to _toggle.py: update toggleshim/testing/mutants.py")
    mutated = types.ModuleType("toggleshim._toggle")
    mutated.__file__ = _toggle.__file__
    exec(compile(source.replace(old, new), _toggle.__file__, "exec"), mutated.__dict__)
    sys.modules["toggleshim._toggle"] = mutated
    _patch._toggle = mutated  # type: ignore[attr-defined]
    _patch.Toggle = mutated.Toggle  # type: ignore[attr-defined]
    _patch._open_statement_toggle = mutated._open_statement_toggle  # type: ignore[attr-defined]
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
