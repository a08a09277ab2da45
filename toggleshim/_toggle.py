"""The toggles and their undo, and the per-module state they share (the reference is the model in
``toggleshim.testing.model``). A toggle made is one of three kinds:

* :class:`_Flat`: exactly Lightning's ``toggle_optimizer``; its undo is Lightning's ``untoggle_optimizer``.
* :class:`_Nested` (inside an open toggle): taken from the user's view, not from the frozen state
  around it; its undo restores the state found.
* :class:`_Own`: the module's own ``toggle_optimizer`` made it (an override without ``super()``, or
  the fallback on unverified code); its undo is the module's own ``untoggle_optimizer``.

Nothing here keeps a module, optimizer or parameter alive, and nothing here knows about blocks.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

from toggleshim._flavours import FLAVOURS
from toggleshim._ours import describe as _describe
from toggleshim._ours import users
from toggleshim._writes import MISSING, RECORD, apply, first, put_record, restore, surely

__all__ = ["own", "refuse_nesting", "same", "state_if_any", "toggle", "untoggled"]

_requires_grad = attrgetter("requires_grad")
_new = object.__new__  # a made toggle is built field by field, without __init__ (the hot path)
_ref = weakref.ref


def _read(opts: Sequence[Any]) -> list[Any]:
    """The *layout*: each optimizer's parameters in Lightning's order, then the optimizer. Two layouts
    of the same objects (``is``) have the same plan. Lean on purpose: it runs at every toggle and exit."""
    layout: list[Any] = []
    for opt in opts:
        for group in opt.param_groups:
            layout += group["params"]
        layout.append(opt)
    return layout


def _picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``lambda seq: tuple(seq[i] for i in indices)`` at C speed."""
    if not indices:
        return lambda seq: ()
    if len(indices) == 1:
        (only,) = indices
        return lambda seq: (seq[only],)
    return itemgetter(*indices)


class _Plan:
    """Toggling one optimizer over a layout, as positions: the managed parameters (first occurrences),
    those the toggle freezes, those the untoggle restores. Cached per module (``_ModuleState``)."""

    __slots__ = ("free", "inside", "managed", "own_mask", "restore")

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


# -- per-module state ---------------------------------------------------------------------------------


class _ModuleState:
    """One module's toggles: the stack of open ones, the last flat one, the plans cached for the last
    layout, and the side channel to the module's own methods.

    The cached layout is the ``id`` of each item, each watched by a weak reference that drops the cache:
    it keeps nothing alive, and while it is kept, equal ids are the same objects.
    """

    __slots__ = ("__weakref__", "exiting", "fallback", "flat", "flat_own", "flat_record", "ids", "module", "plans",
                 "stack", "watches")

    def __init__(self, module: weakref.ref[Any]) -> None:
        self.module = module  # weak: a module's state never keeps it alive
        self.ids: list[int] | None = None
        self.watches: list[weakref.ref[Any]] = []
        self.plans: dict[Any, _Plan] = {}
        self.stack: list[_Made] = []
        # The last flat toggle (weakly), the id of its record, which of the record's keys are its
        # optimizer's: a block entered while it is open as a statement nests inside it (_Flat.nested)
        self.flat: weakref.ref[_Made] | None = None
        self.flat_record = 0
        self.flat_own: tuple[bool, ...] = ()
        # the toggle whose exit is calling the user's untoggle_optimizer: its super() undoes it (untoggled)
        self.exiting: _Made | None = None
        self.fallback: _Own | None = None  # the fallback's open block's toggle: no other opens meanwhile

    def cache(self, layout: list[Any]) -> None:
        """``layout`` is the cached one from now on."""
        self.ids, self.plans, self.watches = None, {}, []  # first: a layout half watched is no cache
        try:
            stale = partial(_stale, _ref(self))
            self.watches = [_ref(item, stale) for item in layout]
        except TypeError:  # an item that cannot be weakly referenced: nothing is cached
            return
        self.ids = list(map(id, layout))


def _stale(state: weakref.ref[_ModuleState], dead: Any) -> None:
    """An item of the cached layout died: the cache goes."""
    s = state()
    if s is not None:
        s.ids, s.plans, s.watches = None, {}, []


# Keyed by id(module), valid while the module lives: its weak reference's callback drops the entry. Not
# on the module itself (``vars(module)``, pickling and ``copy.deepcopy`` would carry it), nor a
# WeakKeyDictionary (a module class may define ``__eq__`` without ``__hash__``).
_STATES: dict[int, _ModuleState] = {}


def _forget(ref: weakref.ref[Any], key: int) -> None:
    state = _STATES.get(key)
    if state is not None and state.module is ref:
        del _STATES[key]


def state_if_any(module: Any) -> _ModuleState | None:
    state = _STATES.get(id(module))
    return state if state is not None and state.module() is module else None


def _state(module: Any) -> _ModuleState:
    state = state_if_any(module)
    if state is None:
        key = id(module)
        state = _ModuleState(weakref.ref(module, lambda ref: _forget(ref, key)))
        _STATES[key] = state  # (only this thread can be toggling this module: it holds it)
    return state


_WRAPPER_MODULES = tuple(f.optimizer_module for f in FLAVOURS)


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer behind a ``LightningOptimizer`` (of either flavour, looked up where Lightning
    defines it: no registry), else itself."""
    if "_optimizer" not in getattr(optimizer, "__dict__", ()):  # a cheap first test: a wrapper has one
        return optimizer
    for name in _WRAPPER_MODULES:
        cls = getattr(sys.modules.get(name), "LightningOptimizer", None)
        if cls is not None and isinstance(optimizer, cls):
            return optimizer._optimizer
    return optimizer


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same optimizer (a ``LightningOptimizer`` is its torch optimizer)."""
    return a is b or _unwrap(a) is _unwrap(b)


# -- validation and messages ---------------------------------------------------------------------


def _is_optimizer(obj: Any) -> bool:
    """``param_groups`` is a list (or tuple) of dicts whose ``"params"`` is a list (or tuple)."""
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
            "toggle_optimizer() expects an optimizer: the LightningOptimizer that self.optimizers() returns (a "
            "torch.optim.Optimizer toggles too, but a block stepping it is not counted in trainer.global_step), "
            f"got {_describe(optimizer)}; nothing was changed"
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
    """The plan for toggling ``optimizer`` over ``layout``; raises, having changed nothing, if it cannot."""
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
    """The cache key of ``optimizer``'s plan: which of the layout's optimizers are it or ``inner``. By
    ``id``: a cached plan's ``inner`` is in the layout, alive while the layout is cached."""
    return id(optimizer) if optimizer is inner else (id(optimizer), id(inner))


def refuse_nesting(module: Any, label: str) -> None:
    """The fallback (on the unverified Lightning ``label``) toggles nothing while one of its blocks is
    open on ``module``: raises, having changed nothing."""
    state = state_if_any(module)
    if state is not None and state.fallback is not None:
        raise RuntimeError(
            f"toggleshim: nested toggle_optimizer blocks are not available on {label}: its toggle code is not "
            "one toggleshim has verified, so `with self.toggle_optimizer(opt):` runs Lightning's own sequence "
            "(toggle; zero_grad; body; step; untoggle), and Lightning's own nested toggles freeze the inner "
            "optimizer's parameters for good. Nothing was changed. Close the outer block first, or run "
            "`python -m toggleshim check`: it names your choices (pin the last release toggleshim verified, "
            "upgrade toggleshim, or certify this Lightning for your project: `python -m toggleshim certify`)."
        )


# -- the toggles made, and their undo -------------------------------------------------------------
# Every undo step is idempotent and marks itself done only once done: an interrupt at any line, even
# a function's first, is made good by a retry (_writes.surely).


class _Made:
    """A toggle made: what it recorded and how to undo it. Single-use; once undone (``done``) it holds
    nothing of the user's. ``entered``: a block runs over it (one on the stack that is not is a
    statement toggle inside a block). ``sync``: the block's no-sync context, let go of by an untoggle."""

    __slots__ = ("__weakref__", "done", "entered", "inner", "managed", "module", "optimizer", "plan", "record",
                 "state", "sync", "vals")

    module: Any
    state: _ModuleState  # kept once undone: the stack is there
    optimizer: Any  # as passed: a LightningOptimizer or a torch optimizer
    inner: Any  # the torch optimizer in it
    plan: _Plan | None
    managed: tuple[Any, ...] | None  # the managed parameters at the toggle
    vals: tuple[bool, ...] | None  # the user's view of each managed parameter (flat: the record's values)
    record: Any  # the record this toggle stored (the module's own toggle: the one it left)
    entered: bool
    done: bool
    sync: Any

    def enterable(self) -> bool:
        """Nothing undid or superseded this toggle since it was made."""
        return not self.done and self.module.__dict__.get(RECORD) is self.record

    def describe(self, status: str) -> str:
        """The ``repr`` of a block over this toggle, in ``status``."""
        return f"<toggleshim.Toggle {status} optimizer={type(self.optimizer).__name__}>"

    def for_block(self) -> _Made:
        """The toggle a block entered over this one holds (this one, as a rule)."""
        return self

    def open(self) -> None:
        """A block starts over this toggle: from here on it is a block's."""
        raise NotImplementedError

    def leave(self) -> BaseException | None:
        """The block's exit: the user's ``untoggle_optimizer(optimizer)``, called once where the manual
        sequence would call it; returns its error. toggleshim's undo follows (:meth:`unwind`)."""
        fn = None if self.done else users(self.module, "untoggle_optimizer")
        if fn is None:  # toggleshim's own (or undone already, by an enclosing block's exit): the undo follows
            return None
        state = self.state
        error: BaseException | None = None
        state.exiting = self
        try:
            fn(self.optimizer)  # its super() reaches toggleshim's untoggle, which undoes this toggle
        except BaseException as e:  # returned: raised once toggleshim's bookkeeping is done
            error = e
        finally:
            state.exiting = None
        if not self.done:  # the method did not call super().untoggle_optimizer
            # ... or an interrupt stopped it first: then undo, writing (never half-undone); a method that
            # returned or raised without super() has the last word on requires_grad: no writes
            interrupted = error is not None and not isinstance(error, Exception)
            try:
                surely(self.unwind, interrupted)
            except BaseException as e:
                error = first(error, e)
        return error

    def abandon(self) -> None:
        """The exit was let go of with the block open (Ctrl-C at its first line): no user code runs."""

    def user_view(self, managed: tuple[Any, ...], now: tuple[bool, ...]) -> tuple[bool, ...]:
        """The user's ``requires_grad`` of ``managed`` (now ``now``) under this toggle: a parameter it
        left live shows its current value, one it froze what it recorded, a new one its current value."""
        assert self.managed is not None and self.vals is not None and self.plan is not None
        recorded = {id(p): v for p, v in zip(self.managed, self.vals)}
        live = {id(p) for p, mine in zip(self.managed, self.plan.own_mask) if mine}
        return tuple(n if id(p) in live else recorded.get(id(p), n) for p, n in zip(managed, now))

    def undo(self) -> None:
        """Untoggle, writing ``requires_grad`` back. Idempotent."""
        raise NotImplementedError

    def forget(self) -> None:
        """Untoggled by the module's own method: only toggleshim's bookkeeping, no write. Idempotent."""
        raise NotImplementedError

    def close(self, write: bool) -> None:
        """:meth:`undo` (or :meth:`forget`) this toggle alone, once more if interrupted, then let go."""
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
        """Done: everything of the user's goes."""
        self.done = True
        self.module = self.optimizer = self.inner = self.plan = self.managed = self.vals = self.record = None
        self.sync = None

    def unwind(self, write: bool = True) -> None:
        """:meth:`close` this toggle and every one open above it, innermost first; the first error
        propagates after all are closed."""
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
    # made while a statement toggle was open: (its record, its optimizer's parameter ids, which of the
    # record's keys those are); a block entered over this toggle nests inside it
    outer: tuple[Any, frozenset[int], tuple[bool, ...]] | None

    def for_block(self) -> _Made:
        return self.nested() if self.outer is not None else self

    def open(self) -> None:
        self.entered = True
        self.state.stack.append(self)

    def undo(self) -> None:
        """Lightning's ``untoggle_optimizer``: by the plan while the optimizers and the record are what
        the toggle left, else Lightning's own untoggle over what the user edited."""
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
        """This toggle as a block entered while a statement toggle was open (not yet untoggled, or
        Lightning's ``toggled_optimizer``): it nests inside the statement, from the user's view, and
        its undo restores the state found and the statement's record. Writes nothing
        (:meth:`_Nested.enter_statement` does)."""
        assert self.outer is not None and self.managed is not None and self.vals is not None
        outer, live, own = self.outer
        recorded = {id(p): v for p, v in outer.items()}
        found = self.vals  # flat: the values found at the call
        user = tuple(n if id(p) in live else recorded.get(id(p), n) for p, n in zip(self.managed, found))
        made: _Nested = _new(_Nested)
        made.module, made.state, made.optimizer, made.inner = self.module, self.state, self.optimizer, self.inner
        made.plan, made.managed, made.vals, made.record = self.plan, self.managed, user, dict(zip(self.managed, user))
        made.entry, made.prev_record, made.entered, made.done = found, outer, True, False
        made.statement, made.sync = own, self.sync
        return made


class _Nested(_Made):
    """A toggle made inside an open one, from the user's view: its undo restores the state found."""

    __slots__ = ("entry", "prev_record", "statement")

    entry: tuple[bool, ...] | None  # every managed requires_grad found at the toggle
    prev_record: Any  # the record to put back on undoing
    statement: tuple[bool, ...] | None

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
        """The writes of a toggle built by :meth:`_Flat.nested`, all or nothing: only the toggled
        optimizer's parameters whose view differs from what the call left (an override's own writes
        after ``super()`` stay)."""
        assert self.plan is not None and self.statement is not None
        assert self.managed is not None and self.vals is not None and self.entry is not None
        module, state = self.module, self.state
        state.flat_record, state.flat_own = id(self.prev_record), self.statement  # the statement is the one open
        write = [(p, want) for p, want, was, mine in zip(self.managed, self.vals, self.entry, self.plan.own_mask)
                 if mine and want is not was]
        previous = module.__dict__.get(RECORD, MISSING)  # the flat toggle's, stored at the call
        apply(module, [p for p, _ in write], [v for _, v in write], [not v for _, v in write], self.record,
              previous, state.stack, self)


class _Own(_Made):
    """The module's own toggle (the user's, or the fallback's on the unverified Lightning ``label``):
    its undo is the module's own ``untoggle_optimizer``; toggleshim writes nothing."""

    __slots__ = ("label",)

    label: str | None  # the fallback's Lightning: while its block is open, no other toggle is made

    def enterable(self) -> bool:
        if self.label is not None and not self.done:
            refuse_nesting(self.module, self.label)  # made before the fallback's open block, entered in it
        return not self.done

    def describe(self, status: str) -> str:
        if self.label is not None:
            return f"<toggleshim fallback toggle {status} on {self.label}>"
        return f"<toggleshim.Toggle {status} (the module's own toggle_optimizer)>"

    def open(self) -> None:
        self.entered = True
        if self.label is not None:
            self.state.fallback = self

    def leave(self) -> BaseException | None:
        try:
            self.abandon()
        except BaseException as e:  # returned: raised once toggleshim's bookkeeping is done
            return e
        return None

    def abandon(self) -> None:
        if not self.done:
            self.module.untoggle_optimizer(self.optimizer)  # there is no other undo

    def undo(self) -> None:
        self.forget()

    def forget(self) -> None:
        if self.state.fallback is self:
            self.state.fallback = None


def own(module: Any, optimizer: Any, label: str | None = None) -> _Made:
    """The toggle the module's own ``toggle_optimizer`` has just made (``label``: the fallback's)."""
    made: _Own = _new(_Own)
    made.module, made.state, made.optimizer, made.inner = module, _state(module), optimizer, _unwrap(optimizer)
    made.plan = made.managed = made.vals = made.sync = None
    made.record = module.__dict__.get(RECORD)
    made.entered = made.done = False
    made.label = label
    return made


def toggle(module: Any, optimizer: Any, opts: Sequence[Any]) -> _Made:
    """Toggle ``optimizer`` on ``module`` over ``opts`` (``trainer.optimizers``) now: flat, or nested in
    the innermost open toggle. Raises, having changed nothing, if it cannot; the writes are all or
    nothing. Returns the toggle made."""
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
    ids = state.ids
    if ids is None or len(layout) != len(ids) or ids != list(map(id, layout)):
        state.cache(layout)  # a new layout: forget the plans of the old one
    key = _plan_key(optimizer, inner)
    plan = state.plans.get(key)
    if plan is None:
        plan = _new_plan(module, optimizer, inner, opts, layout)  # validates: raises before any change
        if plan.inside and state.ids is not None:  # one for an optimizer outside trainer.optimizers is made anew
            state.plans[key] = plan
    managed: tuple[Any, ...] = plan.managed(layout)
    previous = module.__dict__.get(RECORD, MISSING)
    stack = state.stack
    if not stack:  # exactly Lightning's toggle: freeze all but the toggled optimizer's parameters
        # each parameter read and hashed once (its __hash__ is Python's: the largest cost from 100 up)
        record = dict(zip(managed, map(_requires_grad, managed)))
        vals: tuple[bool, ...] = tuple(record.values())
        flat: _Flat = _new(_Flat)
        flat.module, flat.state, flat.optimizer, flat.inner = module, state, optimizer, inner
        flat.plan, flat.layout, flat.managed, flat.vals = plan, layout, managed, vals
        flat.entered = flat.done = False
        flat.sync = None
        # a statement toggle still open: entered, this toggle nests inside it (_Flat.nested)
        flat.outer = _open_statement(state, previous) if state.flat_record == id(previous) and previous else None
        flat.record = record
        apply(module, plan.free(managed), repeat(False), plan.free(vals), record, previous)
        state.flat_record, state.flat_own, state.flat = id(record), plan.own_mask, _ref(flat)
        return flat
    # Nested: the same toggle from the user's view, undone on leaving.
    vals = tuple(map(_requires_grad, managed))
    nested: _Nested = _new(_Nested)
    nested.module, nested.state, nested.optimizer, nested.inner = module, state, optimizer, inner
    nested.plan, nested.managed, nested.entry, nested.prev_record = plan, managed, vals, previous
    nested.entered = nested.done = False
    nested.statement = nested.sync = None
    nested.vals = user = stack[-1].user_view(managed, vals)
    nested.record = record = dict(zip(managed, user))
    targets = [want if mine else False for want, mine in zip(user, plan.own_mask)]
    apply(module, managed, targets, vals, record, previous, stack, nested)  # open from here on
    return nested


def _open_statement(state: _ModuleState, record: Any) -> tuple[Any, frozenset[int], tuple[bool, ...]]:
    """The open statement toggle's record, its optimizer's parameter ids (none when the record's keys
    were edited in number) and which of the record's keys those are."""
    own = state.flat_own
    live = frozenset(id(p) for p, mine in zip(record, own) if mine) if len(record) == len(own) else frozenset()
    return record, live, own


def _lightning_untoggle(module: Any, opts: Sequence[Any], optimizer: Any, inner: Any) -> None:
    """``LightningModule.untoggle_optimizer`` as Lightning writes it (a failing write stops no other)."""
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


def untoggled(module: Any, optimizer: Any) -> bool:
    """toggleshim's part of ``untoggle_optimizer``: True when it undid a toggle of its own (the exiting
    block's, reached through a user's ``super()``; a statement toggle inside a block), and Lightning's
    untoggle must not run. Otherwise the last flat toggle lets go of everything."""
    state = state_if_any(module)
    if state is None:
        return False
    exiting = state.exiting
    if exiting is not None and same(exiting.optimizer, optimizer):
        surely(exiting.unwind)
        return True
    stack = state.stack
    if stack:
        top = stack[-1]
        if not top.entered and same(top.optimizer, optimizer):
            surely(top.unwind)
            return True
        state.flat_record = 0  # Lightning's untoggle empties the record: no statement toggle is open
        return False
    ref, state.flat, state.flat_record = state.flat, None, 0
    flat = ref() if ref is not None else None
    if flat is not None and not flat.entered:  # untoggled as a statement: it holds nothing more
        flat.let_go()
    return False
