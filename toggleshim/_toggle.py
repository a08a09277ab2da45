"""The toggles: Lightning's ``toggle_optimizer`` done exactly, flat or nested, the module's own, and
their undo; the per-module state they share.

The reference is ``toggleshim.testing.model``, the plain-Python model of these semantics; the
property suite checks this file against it and against Lightning's own methods. The block around a
toggle (zero_grad, step, the exit paths) is ``_block.py``; every ``requires_grad`` write goes through
``_writes.py``. A toggle made is one of three kinds, each with its own undo:

* :class:`_Flat` (no toggle of this module is open): exactly Lightning's ``toggle_optimizer``. Every
  parameter held by ``trainer.optimizers`` is recorded and frozen, then the toggled optimizer's
  parameters get their recorded value back; the record is ``module._param_requires_grad_state``. Its
  undo is exactly Lightning's ``untoggle_optimizer``: the *other* optimizers' parameters get the value
  the record holds for them at the exit.
* :class:`_Nested` (inside an open block): the same toggle, taken from the *user's* view rather than
  from the frozen state around it (:meth:`_Made.user_view`); its undo restores exactly the state found.
* :class:`_Own`: the module's own ``toggle_optimizer`` made it (an override that never calls
  ``super()``, a method set on the instance, or Lightning's own method on code toggleshim has not
  verified: the *fallback*); its undo is the module's own ``untoggle_optimizer``. The fallback's blocks
  do not nest (Lightning's nested toggles freeze the inner optimizer's parameters for good).

Nothing here keeps a module, optimizer, parameter or class alive: per-module state dies with its
module, a cached plan holds only integers and its layout is watched through weak references, an undone
toggle holds nothing. Nothing here knows about blocks.
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
    """All that Lightning's toggle and untoggle read of ``trainer.optimizers``, as one list, the
    *layout*: each optimizer's parameters in Lightning's order, followed by the optimizer itself.

    Two layouts holding the same objects (``is``) mean the same optimizers in the same order holding
    the same parameters, so the same plan. Kept this lean on purpose: it runs at every toggle and
    every exit, between ``zero_grad`` and ``step`` (benchmarks/block_vs_manual.py, 10 parameters).
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
    Positions only; cached per module for its current layout (``_ModuleState``)."""

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
    """What toggleshim knows of one module: the stack of open toggles (entered blocks, and nested
    statement toggles), the last flat toggle, the plans cached for the layout last toggled over, and
    what the block's exit shares with the module's own methods.

    The cached layout is kept as the ``id`` of each of its items, each watched through a weak reference
    whose callback drops the cache: the cache never keeps a parameter or optimizer alive (a replaced
    parameter is freed as without toggleshim), and while it is kept every item it names is alive, so
    equal ids are the same objects.
    """

    __slots__ = ("__weakref__", "exiting", "fallback", "flat", "flat_own", "flat_record", "ids", "module", "plans",
                 "stack", "watches")

    def __init__(self, module: weakref.ref[Any]) -> None:
        self.module = module  # weak: a module's state never keeps it alive
        self.ids: list[int] | None = None
        self.watches: list[weakref.ref[Any]] = []
        self.plans: dict[Any, _Plan] = {}
        self.stack: list[_Made] = []
        # The last flat toggle (weakly: let go of at its untoggle, never kept alive), the id of the
        # record it stored and which of the record's keys are its optimizer's (a block entered while
        # that toggle is open as a statement nests inside it: ``_Flat.nested``).
        self.flat: weakref.ref[_Made] | None = None
        self.flat_record = 0
        self.flat_own: tuple[bool, ...] = ()
        # The toggle whose block's exit is calling the module's own ``untoggle_optimizer`` (the user's):
        # toggleshim's untoggle, reached through its ``super()``, undoes it (:func:`untoggled`).
        self.exiting: _Made | None = None
        self.fallback: _Own | None = None  # the fallback's open block's toggle: no other opens meanwhile

    def cache(self, layout: list[Any]) -> None:
        """``layout`` is the cached one from now on (its plans are made as needed)."""
        self.ids, self.plans, self.watches = None, {}, []  # first: a layout half watched is no cache
        try:
            stale = partial(_stale, _ref(self))
            self.watches = [_ref(item, stale) for item in layout]
        except TypeError:  # an item that cannot be weakly referenced: nothing is cached
            return
        self.ids = list(map(id, layout))


def _stale(state: weakref.ref[_ModuleState], dead: Any) -> None:
    """An item of the cached layout died: the cache goes (its plans were for a layout that is gone)."""
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


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same optimizer (a ``LightningOptimizer`` is its torch optimizer)."""
    return a is b or _unwrap(a) is _unwrap(b)


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


def refuse_nesting(module: Any, label: str) -> None:
    """The fallback (Lightning's own toggle, on code toggleshim has not verified, ``label``) toggles
    nothing while one of its blocks is open on ``module``: raises, having changed nothing."""
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
#
# Every undo step is idempotent and marks itself done only once done, so that an interrupt (Ctrl-C)
# at any line, even the first of a function, is made good by a retry (``_writes.surely``).


class _Made:
    """A toggle made: what it recorded and how to undo it. Single-use; once undone (``done``) it holds
    nothing of the user's.

    ``entered``: a block runs over it (set by the block); a toggle on the stack that is not entered is
    a statement toggle made inside a block. ``sync``: the no-sync context the block over it enters
    (``sync_grad=False``), held here so that an untoggle lets go of it too."""

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
        """A block may start over this toggle: nothing undid or superseded it since it was made."""
        return not self.done and self.module.__dict__.get(RECORD) is self.record

    def describe(self, status: str) -> str:
        """The ``repr`` of a block over this toggle, in ``status``."""
        return f"<toggleshim.Toggle {status} optimizer={type(self.optimizer).__name__}>"

    def for_block(self) -> _Made:
        """The toggle a block entered over this one holds (this one, as a rule): no side effects."""
        return self

    def open(self) -> None:
        """A block starts over this toggle (:meth:`for_block`'s): from here on it is a block's."""
        raise NotImplementedError

    def leave(self) -> BaseException | None:
        """The block's exit: the module's own ``untoggle_optimizer(optimizer)``, called once, where
        the manual sequence would call the user's method; returns its error. Toggleshim's own undo
        follows (:meth:`unwind`)."""
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
            # ... or an interrupt stopped it first: then toggleshim's untoggle runs, writing (a Ctrl-C
            # never leaves the toggle half-undone); a method that returned, or raised an error, without
            # super() has the last word on requires_grad: let go without writing
            interrupted = error is not None and not isinstance(error, Exception)
            try:
                surely(self.unwind, interrupted)
            except BaseException as e:
                error = first(error, e)
        return error

    def abandon(self) -> None:
        """The block's exit was let go of with the block still open (an interrupt at the exit's first
        line): no user code runs from there; the undo follows."""

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
        self.sync = None

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
        made.statement, made.sync = own, self.sync
        return made


class _Nested(_Made):
    """A toggle made inside an open one, from the user's view: its undo restores the state found."""

    __slots__ = ("entry", "prev_record", "statement")

    entry: tuple[bool, ...] | None  # every managed requires_grad found at the toggle
    prev_record: Any  # the record to put back on undoing
    # made from a flat toggle inside a statement toggle (_Flat.nested): which of the statement's record
    # keys are its optimizer's
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


class _Own(_Made):
    """The module's own toggle (made by the user's ``toggle_optimizer``, or by Lightning's own on code
    toggleshim has not verified: ``label`` names that Lightning): its undo is the module's own
    ``untoggle_optimizer``, which the block's exit calls; toggleshim writes nothing."""

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
        # the record, dict(zip(managed, requires_grad)): each parameter read and hashed once (its
        # __hash__ is Python's, the largest cost of a toggle from 100 parameters)
        record = dict(zip(managed, map(_requires_grad, managed)))
        vals: tuple[bool, ...] = tuple(record.values())
        flat: _Flat = _new(_Flat)
        flat.module, flat.state, flat.optimizer, flat.inner = module, state, optimizer, inner
        flat.plan, flat.layout, flat.managed, flat.vals = plan, layout, managed, vals
        flat.entered = flat.done = False
        flat.sync = None
        # A statement toggle still open (a record not yet emptied by an untoggle): entered, this
        # toggle nests inside it (_Flat.nested); as a statement it stays Lightning's flat toggle.
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


def untoggled(module: Any, optimizer: Any) -> bool:
    """toggleshim's ``untoggle_optimizer(optimizer)``, before Lightning's: True when it undid a toggle
    of toggleshim's instead (then Lightning's untoggle must not run).

    * the exit of a block of this module calls the module's own ``untoggle_optimizer`` (the user's),
      which reached this through ``super()``: that block's toggle is undone;
    * a statement toggle made inside a block: undone as a nested block;
    * otherwise Lightning's untoggle runs, and the last flat toggle lets go of everything.
    """
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
