"""The exact toggle: Lightning's ``toggle_optimizer`` done exactly, flat or nested, and its undo.

The reference is ``toggleshim.testing.model``, the plain-Python model of these semantics; the
property suite checks this file against it and against Lightning's own methods. The block around a
toggle (zero_grad, step, the exit paths) is ``_block.py``; every ``requires_grad`` write goes through
``_writes.py``.

* *Flat* toggle (no toggle of this module is open): exactly Lightning's ``toggle_optimizer``. Every
  parameter held by ``trainer.optimizers`` is recorded and frozen, then the toggled optimizer's
  parameters get their recorded value back; the record is ``module._param_requires_grad_state``.
  Its undo (:class:`_Flat`) is exactly Lightning's ``untoggle_optimizer``: the *other* optimizers'
  parameters get the value the record holds for them at the exit.
* *Nested* toggle (inside an open block): the same toggle, taken from the *user's* view rather than
  from the frozen state around it (:meth:`_Made.user_view`); its undo (:class:`_Nested`) restores
  exactly the state found at the toggle.

:func:`toggle` makes one and returns it, a :class:`_Flat` or a :class:`_Nested`: what it recorded
and how to undo it. Nothing here keeps a module, optimizer, parameter or class alive: per-module
state dies with its module, a cached plan holds only integers, an undone toggle holds nothing.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

from toggleshim import _writes
from toggleshim._compile import keep_dynamo_out
from toggleshim._flavours import FLAVOURS
from toggleshim._ours import describe as _describe
from toggleshim._writes import MISSING, RECORD, apply, first, put_record, restore

__all__ = ["toggle"]

_requires_grad = attrgetter("requires_grad")
_new = object.__new__  # a made toggle is built field by field, without __init__ (the hot path)
_ref = weakref.ref


def _read(opts: Sequence[Any]) -> list[Any]:
    """All that Lightning's toggle and untoggle read of ``trainer.optimizers``, as one list, the
    *layout*: each optimizer's parameters in Lightning's order, followed by the optimizer itself.

    Two layouts holding the same objects (``is``) mean the same optimizers in the same order holding
    the same parameters, so the same plan. Kept this lean on purpose: it runs at every toggle and
    every exit, between ``zero_grad`` and ``step``, where each extra operation costs several times
    its cost in isolation (benchmarks/bench_toggle.py, 10 parameters).
    """
    layout: list[Any] = []
    for opt in opts:
        for group in opt.param_groups:
            layout += group["params"]
        layout.append(opt)
    return layout


def _picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``lambda seq: tuple(seq[i] for i in indices)`` at C speed (``itemgetter`` has odd arities)."""
    if not indices:
        return lambda seq: ()
    if len(indices) == 1:
        (only,) = indices
        return lambda seq: (seq[only],)
    return itemgetter(*indices)


class _Plan:
    """How toggling one optimizer reads a layout: which items are the managed parameters (first
    occurrences, in Lightning's order), which of them the toggle freezes, which the untoggle restores.
    Positions only, plus the last record built (see the flat toggle); cached per module for its
    current layout (``_ModuleState``)."""

    __slots__ = ("free", "inside", "last_record", "last_vals", "managed", "own_mask", "restore")

    def __init__(
        self, layout: Sequence[Any], ends: Sequence[int], toggled: Sequence[int], outside: Sequence[Any] | None
    ) -> None:
        first: set[int] = set()
        managed_at: list[int] = []  # positions in the layout of the managed parameters
        own: set[int] = set() if outside is None else {id(p) for p in outside}  # the toggled optimizer's
        restored: set[int] = set()  # what Lightning's untoggle restores: the other optimizers' parameters
        k = 0  # the optimizer the layout is at
        for pos, item in enumerate(layout):
            if k < len(ends) and pos == ends[k]:  # the optimizer that ends its parameters
                k += 1
                continue
            key = id(item)
            if key not in first:
                first.add(key)
                managed_at.append(pos)
            (own if k in toggled else restored).add(key)
        order = [id(layout[pos]) for pos in managed_at]
        self.managed = _picker(managed_at)  # layout -> the managed parameters
        self.own_mask = tuple(key in own for key in order)  # which managed ones are the toggled optimizer's
        self.free = _picker([i for i, key in enumerate(order) if key not in own])  # managed -> frozen ones
        self.restore = _picker([i for i, key in enumerate(order) if key in restored])  # managed -> restored
        self.inside = bool(toggled)  # the optimizer is one of trainer.optimizers (the plan can be cached)
        self.last_vals: tuple[bool, ...] | None = None
        self.last_record: dict[Any, bool] | None = None


class _ModuleState:
    """Per-module bookkeeping: the stack of open toggles (entered blocks, and nested statement
    toggles), and a cache: the layout last toggled over and the plans for it, by the toggled optimizer
    (``_plan_key``).

    The cache holds the parameters and optimizers of that layout (so that an identity check proves a
    new layout is the same). It is dropped when the layout changes (at the next toggle), at every full
    garbage collection (``_drop_caches``, so ``gc.collect()`` frees a replaced parameter as it would
    without toggleshim) and with the module.
    """

    __slots__ = ("exiting", "flat", "flat_own", "flat_record", "layout", "module", "plans", "stack")

    def __init__(self, module: weakref.ref[Any]) -> None:
        self.module = module  # weak: a module's state never keeps it alive
        self.layout: list[Any] | None = None
        self.plans: dict[Any, _Plan] = {}
        self.stack: list[_Made] = []
        # The last flat toggle: its block (weakly: let go of at its untoggle, never kept alive; set by
        # _block), the id of the record it stored and which of the record's keys are its optimizer's
        # (a block entered while that toggle is open as a statement nests inside it: ``_Flat.nested``).
        self.flat: weakref.ref[Any] | None = None
        self.flat_record = 0
        self.flat_own: tuple[bool, ...] = ()
        # The toggle whose block's exit is calling the module's own ``untoggle_optimizer`` (a
        # subclass's override): toggleshim's untoggle, reached through ``super()``, undoes it.
        self.exiting: _Made | None = None


# Keyed by id(module), valid while the module lives: its weak reference's callback drops the entry.
_STATES: dict[int, _ModuleState] = {}


def _forget(ref: weakref.ref[Any], key: int) -> None:
    state = _STATES.get(key)
    if state is not None and state.module is ref:
        del _STATES[key]


def _state_if_any(module: Any) -> _ModuleState | None:
    state = _STATES.get(id(module))
    return state if state is not None and state.module() is module else None


def _state(module: Any) -> _ModuleState:
    state = _state_if_any(module)
    if state is None:
        key = id(module)
        state = _STATES[key] = _ModuleState(weakref.ref(module, lambda ref: _forget(ref, key)))
    return state


def _drop_caches(phase: str, info: dict[str, int]) -> None:
    """A full collection starts (``gc.collect()`` among them): every module drops its cache, so that no
    parameter outlives a full collection because of toggleshim.

    Python's gc prints and drops whatever a callback raises ("Exception ignored"): a Ctrl-C landing in
    this body is delivered again to the main thread, from another thread, once the collection is over
    (its "stop" callback lets that thread go; delivered from here, it would land here again). One that
    lands on the call itself, before its first line, is Python's to drop: docs/guarantees.md."""
    try:
        if phase == "start" and info.get("generation") == 2:
            for state in list(_STATES.values()):
                state.layout = None
                state.plans = {}
    except KeyboardInterrupt:
        held = _thread.allocate_lock()
        held.acquire()
        _REDELIVER.append(held)
        _thread.start_new_thread(_redeliver, (held,))  # (not threading's: its start() waits, here)
    if phase == "stop" and _REDELIVER:
        _REDELIVER.pop().release()


# The Ctrl-C caught in _drop_caches, to be delivered again once its collection is over: a lock that
# the delivering thread waits for, released by the collection's "stop" callback.
_REDELIVER: list[Any] = []


def _redeliver(held: Any) -> None:
    held.acquire()  # the collection is over
    time.sleep(0.005)  # and gc has returned to the code it interrupted
    _thread.interrupt_main()


# One callback, also after importlib.reload of this module (which would add a second).
gc.callbacks[:] = [cb for cb in gc.callbacks if getattr(cb, "__qualname__", None) != "_drop_caches"
                   or getattr(cb, "__module__", None) != __name__]
gc.callbacks.append(_drop_caches)


_WRAPPER_MODULES = tuple(f.optimizer_module for f in FLAVOURS)


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer behind a ``LightningOptimizer`` (of either flavour), else itself.

    The classes are looked up where Lightning defines them, at each call: no registry to keep in step
    (or to lose on a reload), and no cache of the class Lightning makes for every wrapper.
    """
    if "_optimizer" not in getattr(optimizer, "__dict__", ()):  # a cheap first test: a wrapper has one
        return optimizer
    for name in _WRAPPER_MODULES:
        cls = getattr(sys.modules.get(name), "LightningOptimizer", None)
        if cls is not None and isinstance(optimizer, cls):
            return optimizer._optimizer
    return optimizer


# -- validation and messages ---------------------------------------------------------------------


def _is_optimizer(obj: Any) -> bool:
    """``param_groups`` is a list (or tuple) of dicts whose ``"params"`` is a list (or tuple), as
    torch stores them."""
    try:
        groups = obj.param_groups
        return isinstance(groups, (list, tuple)) and all(
            isinstance(g, dict) and isinstance(g.get("params"), (list, tuple)) for g in groups
        )
    except Exception:
        return False  # no readable param_groups: not an optimizer


def _check_optimizer(optimizer: Any) -> None:
    """Reject anything that is not an optimizer, before a single ``requires_grad`` changes."""
    if not _is_optimizer(optimizer):
        raise TypeError(
            "toggle_optimizer() expects an optimizer (a torch.optim.Optimizer or the LightningOptimizer "
            f"that self.optimizers() returns), got {_describe(optimizer)}; nothing was changed"
        )


def _check_trainer_optimizers(opts: Iterable[Any]) -> None:
    """Name the entry of ``trainer.optimizers`` that is not an optimizer, if any."""
    for k, opt in enumerate(opts):
        if not _is_optimizer(opt):
            raise TypeError(
                f"toggle_optimizer(): trainer.optimizers[{k}] is not an optimizer (its param_groups must be "
                f"dicts holding a list of parameters), got {_describe(opt)}; nothing was changed"
            )


def _param_name(module: Any, param: Any) -> str:
    try:
        for name, p in module.named_parameters(remove_duplicate=False):
            if p is param:
                return f"parameter {name!r}"
    except Exception:
        pass  # the name is a courtesy: the message below still says what is wrong
    shape = getattr(param, "shape", None)
    what = f"of shape {tuple(shape)}" if isinstance(shape, Iterable) else _describe(param)
    return f"an unnamed parameter {what} (not a parameter of {type(module).__name__})"


def _not_a_tensor(item: Any) -> TypeError:
    return TypeError(
        f"toggle_optimizer(): an optimizer holds {_describe(item)} where a parameter (a tensor) belongs; "
        "nothing was changed"
    )


def _new_plan(module: Any, optimizer: Any, inner: Any, opts: Sequence[Any], layout: list[Any]) -> _Plan:
    """The plan for toggling ``optimizer`` over ``layout`` (read from ``opts``); raises, having changed
    nothing, if it cannot be toggled."""
    import torch

    _check_optimizer(optimizer)
    ends: list[int] = []  # the position in the layout of each optimizer (after its parameters)
    for pos, item in enumerate(layout):
        if isinstance(item, torch.Tensor):
            continue
        if len(ends) < len(opts) and item is opts[len(ends)]:
            ends.append(pos)
        else:
            raise _not_a_tensor(item)
    toggled = [k for k, opt in enumerate(opts) if opt is optimizer or opt is inner]  # Lightning's test
    outside = None if toggled else [p for group in optimizer.param_groups for p in group["params"]]
    if outside is not None:
        for item in outside:
            if not isinstance(item, torch.Tensor):
                raise _not_a_tensor(item)
        managed = {id(p) for p in layout}
        strangers = [p for p in outside if id(p) not in managed]
        if strangers:
            # Lightning would raise a bare KeyError after freezing everything.
            raise ValueError(
                f"toggle_optimizer(): the optimizer holds {_param_name(module, strangers[0])}, which none "
                f"of trainer.optimizers holds ({len(strangers)} such parameter(s)); pass an optimizer "
                "returned by configure_optimizers (self.optimizers()); nothing was changed"
            )
    return _Plan(layout, ends, toggled, outside)


def _plan_key(optimizer: Any, inner: Any) -> Any:
    """The cache key of ``optimizer``'s plan over an unchanged layout: what decides the plan is which
    of the layout's optimizers are ``optimizer`` or ``inner``. By ``id``: a cached plan's ``inner`` is
    one of the layout's optimizers, alive while the layout is cached; an ``optimizer`` wrapping it that
    is not among them toggles the same positions as any other wrapper at its address would."""
    return id(optimizer) if optimizer is inner else (id(optimizer), id(inner))


# -- the toggle made, and its undo -----------------------------------------------------------------
#
# Every undo step is idempotent and marks itself done only once done, so that an interrupt (Ctrl-C)
# at any line, even the first of a function, is made good by a retry (``_writes.surely``).


class _Made:
    """A toggle made by :func:`toggle`: what it recorded and how to undo it. Single-use; once undone
    (``done``) it holds nothing of the user's.

    ``entered``: a block runs over it (set by ``_block``); a toggle on the stack that is not entered
    is a statement toggle made inside a block."""

    __slots__ = ("block", "done", "entered", "inner", "managed", "module", "optimizer", "plan", "record", "state",
                 "vals")

    module: Any
    state: _ModuleState  # kept once undone: the stack is there
    optimizer: Any  # as passed: a LightningOptimizer or a torch optimizer
    inner: Any  # the torch optimizer in it
    plan: _Plan | None
    managed: tuple[Any, ...] | None  # the managed parameters at the toggle
    vals: tuple[bool, ...] | None  # the user's view of each managed parameter (flat: the record's values)
    record: dict[Any, bool] | None  # the record this toggle stored
    entered: bool
    done: bool
    block: weakref.ref[Any] | None  # a nested statement toggle's block object (weakly), set by _block

    def owned_by(self, block: Any) -> None:
        """``block`` (``_block.Toggle``) runs over this toggle; held weakly, so that an untoggle can make
        a kept statement toggle's object let go of everything."""
        raise NotImplementedError

    def enterable(self) -> bool:
        """A block may start over this toggle: nothing undid or superseded it since it was made."""
        return not self.done and self.module.__dict__.get(RECORD) is self.record

    def for_block(self) -> _Made:
        """The toggle a block entered over this one holds (this one, as a rule): no side effects."""
        return self

    def open(self) -> None:
        """A block starts over this toggle (:meth:`for_block`'s): from here on it is a block's."""
        raise NotImplementedError

    def user_view(self, managed: tuple[Any, ...], now: tuple[bool, ...]) -> tuple[bool, ...]:
        """The user's ``requires_grad`` for ``managed`` (currently ``now``) while this toggle is the
        innermost: a parameter it left live shows its current value, one it froze what it recorded,
        one the optimizers took on since its current value."""
        assert self.managed is not None and self.vals is not None and self.plan is not None
        recorded = {id(p): v for p, v in zip(self.managed, self.vals)}
        live = {id(p) for p, mine in zip(self.managed, self.plan.own_mask) if mine}
        return tuple(n if id(p) in live else recorded.get(id(p), n) for p, n in zip(managed, now))

    def undo(self) -> None:
        """Untoggle, writing ``requires_grad`` back. Idempotent."""
        raise NotImplementedError

    def forget(self) -> None:
        """Untoggled by someone else (the module's own ``untoggle_optimizer`` had its say): no write,
        only toggleshim's bookkeeping. Idempotent."""
        raise NotImplementedError

    def close(self, write: bool) -> None:
        """:meth:`undo` (``write=False``: :meth:`forget`) this toggle alone, once more if interrupted or
        failed partway, then let go of everything."""
        if self.done:
            return
        fn = self.undo if write else self.forget
        try:
            try:  # (surely's retry, written out: an interrupt at the call's line is retried too)
                fn()
            except BaseException:
                with contextlib.suppress(Exception):
                    fn()
                raise
        finally:
            self.let_go()

    def let_go(self) -> None:
        """Done: everything of the user's goes (the module's state stays, for the stack: it holds
        nothing of the module once the module dies)."""
        self.done = True
        self.module = self.optimizer = self.inner = self.plan = self.managed = self.vals = self.record = None
        self.block = None

    def unwind(self, write: bool = True) -> None:
        """:meth:`close` this toggle and every toggle still open above it on the stack, innermost
        first; one that fails does not stop the others (the first error propagates after)."""
        stack = self.state.stack
        if stack and stack[-1] is self:  # the innermost, as usual
            self.close(write)
            stack.pop()
            return
        at = next((i for i, t in enumerate(stack) if t is self), len(stack))
        error: BaseException | None = None
        for t in stack[at:][::-1] or [self]:
            try:
                t.close(write)
            except BaseException as e:  # re-raised below, after the others
                error = first(error, e)
        del stack[at:]
        if error is not None:
            raise error


class _Flat(_Made):
    """Lightning's own toggle, made: its undo is Lightning's ``untoggle_optimizer``."""

    __slots__ = ("layout", "outer")

    layout: list[Any] | None  # the layout at the toggle
    # made while a statement toggle was open: (its record, the ids of its optimizer's parameters,
    # which of the record's keys those are); a block entered over this toggle nests inside it
    outer: tuple[Any, frozenset[int], tuple[bool, ...]] | None

    def owned_by(self, block: Any) -> None:
        self.state.flat = _ref(block)

    def for_block(self) -> _Made:
        return self.nested() if self.outer is not None else self

    def open(self) -> None:
        self.entered = True
        self.state.stack.append(self)

    def undo(self) -> None:
        """Lightning's ``untoggle_optimizer`` after this toggle.

        While the optimizers' lists and the record are what the toggle left (the record's keys are the
        managed parameters in order, its values the very bools recorded), the plan says what to restore,
        without Lightning's tensor-keyed lookups. Otherwise (the user edited either), Lightning's own
        untoggle, over the current lists and record.
        """
        module = self.module
        opts = module.trainer.optimizers
        layout, managed, vals = self.layout, self.managed, self.vals
        assert self.plan is not None and layout is not None and managed is not None and vals is not None
        record = module.__dict__.get(RECORD)
        now = _read(opts)
        try:
            if (
                len(now) == len(layout)
                and all(map(is_, now, layout))  # the same optimizers, so the toggled one at the same places
                and type(record) is dict  # not .__class__, which a subclass can fake
                and len(record) == len(managed)
                and all(map(is_, record, managed))
                and all(map(is_, record.values(), vals))  # not ==: 1 == True, which Lightning's write refuses
            ):
                picks = self.plan.restore
                restore(picks(managed), picks(vals))
            else:
                _lightning_untoggle(module, opts, self.optimizer, self.inner)
        finally:  # closed even when a write is refused: no statement toggle is open
            self.forget()
        # Lightning assigns through nn.Module.__setattr__, which stores a dict in __dict__ (10x slower).
        module.__dict__[RECORD] = {}

    def forget(self) -> None:
        self.state.flat_record = 0  # the record left behind is no open statement toggle

    def let_go(self) -> None:
        _Made.let_go(self)
        self.layout = self.outer = None

    def nested(self) -> _Nested:
        """This toggle as a block entered while a statement toggle of the module was open
        (``toggle_optimizer`` not yet untoggled, or Lightning's ``toggled_optimizer``): the block nests
        inside the statement as inside a block. Builds the nested toggle; :meth:`_Nested.enter_statement`
        makes its writes.

        The toggle made at the call was Lightning's flat one (a statement toggle inside a statement
        toggle stays exactly Lightning's); the nested one is taken from the user's view (a parameter
        the statement left live shows its value at the call, one it froze what the statement
        recorded), and its undo restores the state found at the call, and the statement's record."""
        assert self.outer is not None and self.managed is not None and self.vals is not None
        outer, live, own = self.outer
        recorded = {id(p): v for p, v in outer.items()}
        found = self.vals  # flat: the values found at the call
        user = tuple(n if id(p) in live else recorded.get(id(p), n) for p, n in zip(self.managed, found))
        made: _Nested = _new(_Nested)
        made.module, made.state, made.optimizer, made.inner = self.module, self.state, self.optimizer, self.inner
        made.plan, made.managed, made.vals, made.record = self.plan, self.managed, user, dict(zip(self.managed, user))
        made.entry, made.prev_record, made.entered, made.done = found, outer, True, False
        made.block, made.statement = None, own
        return made


class _Nested(_Made):
    """A toggle made inside an open one, from the user's view: its undo restores the state found."""

    __slots__ = ("entry", "prev_record", "statement")

    entry: tuple[bool, ...] | None  # every managed requires_grad found at the toggle
    prev_record: Any  # the record to put back on undoing
    # made from a flat toggle inside a statement toggle (_Flat.nested): which of the statement's record
    # keys are its optimizer's
    statement: tuple[bool, ...] | None

    def owned_by(self, block: Any) -> None:
        self.block = _ref(block)

    def enterable(self) -> bool:
        stack = self.state.stack
        return _Made.enterable(self) and bool(stack) and stack[-1] is self

    def open(self) -> None:
        if self.statement is not None:  # made by _Flat.nested: its writes are made now
            self.enter_statement()
        self.entered = True

    def undo(self) -> None:
        assert self.managed is not None and self.entry is not None
        try:
            restore(self.managed, self.entry)
        finally:  # a refused write does not keep the nested record: the enclosing one's is back
            self.forget()

    def forget(self) -> None:
        put_record(self.module, self.prev_record)

    def let_go(self) -> None:
        _Made.let_go(self)
        self.entry = self.prev_record = self.statement = None

    def enter_statement(self) -> None:
        """Make the writes of a nested toggle built by :meth:`_Flat.nested`, all or nothing: the
        statement's record is the one open, and only the parameters of this toggle's optimizer whose
        view differs from what the call left are written (what an override of ``toggle_optimizer``
        did after ``super()`` stays)."""
        assert self.plan is not None and self.statement is not None
        assert self.managed is not None and self.vals is not None and self.entry is not None
        module, state = self.module, self.state
        state.flat_record, state.flat_own = id(self.prev_record), self.statement  # the statement is the one open
        write = [(p, want) for p, want, was, mine in zip(self.managed, self.vals, self.entry, self.plan.own_mask)
                 if mine and want is not was]
        previous = module.__dict__.get(RECORD, MISSING)  # the flat toggle's, stored at the call
        apply(module, [p for p, _ in write], [v for _, v in write], [not v for _, v in write], self.record,
              previous, state.stack, self)


def toggle(module: Any, optimizer: Any, opts: Sequence[Any]) -> _Made:
    """Toggle ``optimizer`` on ``module`` now, over ``opts`` (``trainer.optimizers``): flat where no
    toggle of the module is open, nested inside the innermost open one otherwise. Validates first:
    raises, having changed nothing, if ``optimizer`` cannot be toggled; the writes are all or nothing.
    Returns the toggle made (what it recorded, how to undo it)."""
    inner = _unwrap(optimizer) if "_optimizer" in getattr(optimizer, "__dict__", ()) else optimizer
    try:
        layout = _read(opts)
    except Exception:
        _check_trainer_optimizers(opts)  # a clear TypeError naming what is not an optimizer,
        _check_optimizer(optimizer)  # else the original error
        raise
    state = _STATES.get(id(module))
    if state is None or state.module() is not module:
        state = _state(module)
    cached = state.layout
    if cached is None or len(layout) != len(cached) or not all(map(is_, layout, cached)):
        state.layout, state.plans = layout, {}  # a new layout: forget the plans of the old one
    key = _plan_key(optimizer, inner)
    plan = state.plans.get(key)
    if plan is None:
        plan = _new_plan(module, optimizer, inner, opts, layout)  # validates: raises before any change
        if plan.inside:  # an optimizer outside trainer.optimizers is planned at every toggle
            state.plans[key] = plan
    managed: tuple[Any, ...] = plan.managed(layout)
    vals: tuple[bool, ...] = tuple(map(_requires_grad, managed))
    previous = module.__dict__.get(RECORD, MISSING)
    stack = state.stack
    if not stack:  # exactly Lightning's toggle: freeze all but the toggled optimizer's parameters
        flat: _Flat = _new(_Flat)
        flat.module, flat.state, flat.optimizer, flat.inner = module, state, optimizer, inner
        flat.plan, flat.layout, flat.managed, flat.vals = plan, layout, managed, vals
        flat.entered = flat.done = False
        flat.block = None
        # A statement toggle still open (a record not yet emptied by an untoggle): entered, this
        # toggle nests inside it (_Flat.nested); as a statement it stays Lightning's flat toggle.
        flat.outer = _open_statement(state, previous) if state.flat_record == id(previous) and previous else None
        # The record, dict(zip(managed, vals)): a copy of the plan's last one when the values are the
        # same (a copy reuses the stored hashes; building one calls Tensor.__hash__, in Python, for every
        # parameter, the largest cost of a toggle at 1,000 parameters and more).
        if vals != plan.last_vals:
            plan.last_record, plan.last_vals = dict(zip(managed, vals)), vals
        flat.record = record = plan.last_record.copy()  # type: ignore[union-attr]
        apply(module, plan.free(managed), repeat(False), plan.free(vals), record, previous)
        state.flat_record, state.flat_own = id(record), plan.own_mask
        return flat
    # Nested: the same toggle from the user's view, undone on leaving.
    nested: _Nested = _new(_Nested)
    nested.module, nested.state, nested.optimizer, nested.inner = module, state, optimizer, inner
    nested.plan, nested.managed, nested.entry, nested.prev_record = plan, managed, vals, previous
    nested.entered = nested.done = False
    nested.block = nested.statement = None
    nested.vals = user = stack[-1].user_view(managed, vals)
    nested.record = record = dict(zip(managed, user))
    targets = [want if mine else False for want, mine in zip(user, plan.own_mask)]
    apply(module, managed, targets, vals, record, previous, stack, nested)  # open from here on
    return nested


def _open_statement(state: _ModuleState, record: Any) -> tuple[Any, frozenset[int], tuple[bool, ...]]:
    """The statement toggle still open: ``record`` is the very record the module's last flat toggle
    stored (toggleshim's untoggle forgets it). Its record, the ids of the parameters its optimizer
    holds (none when the record's keys were edited in number: then every recorded parameter shows what
    it recorded), and which of the record's keys those are."""
    own = state.flat_own
    live = frozenset(id(p) for p, mine in zip(record, own) if mine) if len(record) == len(own) else frozenset()
    return record, live, own


def _lightning_untoggle(module: Any, opts: Sequence[Any], optimizer: Any, inner: Any) -> None:
    """``LightningModule.untoggle_optimizer`` as Lightning writes it (it reads the record at each
    parameter; a failing write here does not stop the others)."""
    params: list[Any] = []
    values: list[Any] = []
    for opt in opts:
        if not (opt is optimizer or opt is inner):
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in module._param_requires_grad_state:
                        params.append(param)
                        values.append(module._param_requires_grad_state[param])
    restore(params, values)


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same optimizer (a ``LightningOptimizer`` is its torch optimizer)."""
    return a is b or _unwrap(a) is _unwrap(b)


keep_dynamo_out(globals())
keep_dynamo_out(vars(_writes))  # every requires_grad write is made there
