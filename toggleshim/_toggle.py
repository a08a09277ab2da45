"""The toggle: Lightning's ``toggle_optimizer`` done exactly, and as a context manager.

The reference is ``toggleshim.testing.model``, the plain-Python model of these semantics; the
property suite checks this file against it and against Lightning's own methods.

Semantics (README, "Semantics"):

* *Flat* toggle (no block of this module is open): exactly Lightning's ``toggle_optimizer``. Every
  parameter held by ``trainer.optimizers`` is recorded and frozen, then the toggled optimizer's
  parameters get their recorded value back; the record is ``module._param_requires_grad_state``.
  A flat block's exit is exactly Lightning's ``untoggle_optimizer``: the *other* optimizers'
  parameters get the value the record holds for them at the exit.
* *Nested* toggle (inside an open block): the same toggle, taken from the *user's* view rather than
  from the frozen state around it; leaving restores exactly the state found on entry.

Robustness rules, each kept by a test (README, "Guarantees"):

* Nothing changes before the input is validated; exceptions propagate unchanged, never swallowed.
* ``requires_grad`` changes are all or nothing: a toggle that fails or is interrupted (Ctrl-C at any
  line) undoes what it wrote; an untoggle that fails or is interrupted still makes every other write.
* Nothing here keeps a module, optimizer, parameter or class alive: per-module state dies with its
  module, a cached plan holds only integers, a closed toggle holds nothing.

Where to read: ``_toggle_optimizer`` (the toggle), ``Toggle.__exit__`` and ``Toggle._close`` (the
block's exit paths), ``Toggle._user_view`` (the nesting rule).
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter, is_, itemgetter
from types import MethodType, TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from toggleshim._flavours import FLAVOURS
from toggleshim._ours import CORE_MODULES as _CORE_MODULES
from toggleshim._ours import check_flags as _check_flags
from toggleshim._ours import describe as _describe
from toggleshim._ours import overrides, route

__all__ = ["Toggle", "toggle"]

_OptT = TypeVar("_OptT")
_requires_grad = attrgetter("requires_grad")
_RECORD = "_param_requires_grad_state"  # Lightning's name for the record, on the module
_MISSING: Any = object()
_new = object.__new__  # a Toggle is made without calling Toggle.__new__ (which toggles)
_ref = weakref.ref
_MADE, _OPEN, _CLOSED = 0, 1, 2  # a Toggle's phase: toggled (statement, or not entered yet), in its block, undone
_UNTOGGLED = 3  # a statement toggle whose untoggle_optimizer ran: it holds nothing more



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
    """Per-module bookkeeping: the stack of open blocks (and nested statement toggles), and a cache:
    the layout last toggled over and the plans for it, by the toggled optimizer (``_plan_key``).

    The cache holds the parameters and optimizers of that layout (so that an identity check proves a
    new layout is the same). It is dropped when the layout changes (at the next toggle), at every full garbage
    collection (``_drop_caches``, so ``gc.collect()`` frees a replaced parameter as it would without
    toggleshim) and with the module.
    """

    __slots__ = ("exiting", "flat", "flat_own", "flat_record", "layout", "module", "plans", "stack")

    def __init__(self, module: weakref.ref[Any]) -> None:
        self.module = module  # weak: a module's state never keeps it alive
        self.layout: list[Any] | None = None
        self.plans: dict[Any, _Plan] = {}
        self.stack: list[Toggle[Any]] = []
        # The last flat toggle: the Toggle (weakly: let go of it at its untoggle, never kept alive),
        # the id of the record it stored and which of the record's keys are its optimizer's (a block
        # entered while that toggle is open as a statement nests inside it: ``Toggle._nest``).
        self.flat: weakref.ref[Toggle[Any]] | None = None
        self.flat_record = 0
        self.flat_own: tuple[bool, ...] = ()
        # The block whose exit is calling the module's own ``untoggle_optimizer`` (a subclass's
        # override): toggleshim's untoggle, reached through ``super()``, closes that block.
        self.exiting: Toggle[Any] | None = None


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
    (delivered from here, it would land here again). One that lands on the call itself, before its
    first line, is Python's to drop: docs/guarantees.md."""
    try:
        if phase == "start" and info.get("generation") == 2:
            for state in list(_STATES.values()):
                state.layout = None
                state.plans = {}
    except KeyboardInterrupt:
        threading.Timer(0.001, _thread.interrupt_main).start()


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


# -- writing requires_grad, and which error propagates ----------------------------------------------
#
# One rule: when several things go wrong, the first *error* (an Exception: a refused write, a failing
# step) propagates unchanged and later errors are dropped; an *interrupt* (KeyboardInterrupt,
# SystemExit: any other BaseException) is never dropped, it propagates ahead of errors.


def _first(error: BaseException | None, new: BaseException) -> BaseException:
    """Which of two exceptions propagates (the rule above): the first, unless only ``new`` interrupts."""
    if error is None or (isinstance(error, Exception) and not isinstance(new, Exception)):
        return new
    return error


def _assign(params: Iterable[Any], values: Iterable[bool]) -> None:
    """``p.requires_grad = v`` for every pair; a write that fails does not stop the others. After the
    last write, the first error (or interrupt) propagates."""
    error: BaseException | None = None
    for p, v in zip(params, values):
        try:
            p.requires_grad = v
        except BaseException as e:  # re-raised below, after the other writes
            error = _first(error, e)
    if error is not None:
        raise error


def _surely(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)``, and once more if anything interrupts it (Ctrl-C between two lines, a failing
    write), so that it completes before the error propagates: ``fn`` must be idempotent. The first
    error propagates unchanged; an error of the second run is dropped (an interrupt is not)."""
    try:
        fn(*args)
    except BaseException:
        with contextlib.suppress(Exception):
            fn(*args)
        raise


def _quietly(fn: Callable[..., None], *args: Any, retry: bool = True) -> None:
    """``_surely(fn, *args)`` (``retry=False``: ``fn(*args)``, for a cleanup that calls the user's code
    once) while an error is already in flight (an ``except`` clause, an exit with the body's exception):
    the cleanup completes and its own errors are dropped, so that the error in
    flight propagates unchanged; an interrupt during the cleanup still propagates."""
    with contextlib.suppress(Exception):
        _surely(fn, *args) if retry else fn(*args)


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
    _assign(params, values)


# -- the toggle object ----------------------------------------------------------------------------


class Toggle(Generic[_OptT]):
    """What ``self.toggle_optimizer(optimizer, zero_grad=True, step=True)`` returns.

    The toggle has already happened when you hold this object. Use it as a statement (Lightning's
    behaviour, pair it with ``untoggle_optimizer``) or as a block::

        with self.toggle_optimizer(opt) as opt:   # zero_grad() on entry
            self.manual_backward(loss)
        # clean exit: opt.step(), then untoggle; any exception: no step, untoggle, re-raised

    A toggle object is single-use. After the block it holds no reference to the module, the
    optimizer or any parameter.
    """

    __slots__ = (
        "__weakref__",
        "_entry",
        "_guard",
        "_inner",
        "_layout",
        "_managed",
        "_module",
        "_nested",
        "_optimizer",
        "_outer",
        "_phase",
        "_plan",
        "_prev_record",
        "_record",
        "_state",
        "_step",
        "_stepped",
        "_sync",
        "_sync_exit",
        "_vals",
        "_zero_grad",
    )

    _entry: tuple[bool, ...] | None  # nested: every managed requires_grad found at the toggle
    _guard: weakref.ref[Any] | None  # the __exit__ the with statement holds, watched (see _ExitGuard)
    _inner: Any  # the torch optimizer in _optimizer
    _layout: list[Any] | None  # the layout at the toggle
    _managed: tuple[Any, ...] | None  # the managed parameters at the toggle
    _module: Any
    _nested: bool
    _optimizer: _OptT | None
    # flat, made while a statement toggle was open: (its record, the ids of its optimizer's parameters,
    # which of the record's keys those are)
    _outer: tuple[Any, frozenset[int], tuple[bool, ...]] | None
    _phase: int
    _plan: _Plan | None
    _prev_record: Any  # nested: the record to put back on leaving
    _record: dict[Any, bool] | None  # the record this toggle stored
    _state: _ModuleState | None
    _step: bool
    _stepped: bool  # the block's optimizer stepped while the block was open (_note_step)
    _sync: Any  # sync_grad=False: the strategy's block_backward_sync, then the context it made
    _sync_exit: list[Callable[..., Any]] | None  # the entered context's __exit__, until it is called
    _vals: tuple[bool, ...] | None  # the user's view of every managed parameter (flat: the record's values)
    _zero_grad: bool

    def __new__(
        cls, module: Any, optimizer: _OptT, zero_grad: bool = True, step: bool = True, sync_grad: bool = True
    ) -> Toggle[_OptT]:
        return toggle(module, optimizer, zero_grad, step, sync_grad)  # the fallback too, as toggle()

    # -- nesting ----------------------------------------------------------------------------

    def _user_view(self, managed: tuple[Any, ...], now: tuple[bool, ...]) -> tuple[bool, ...]:
        """The user's ``requires_grad`` for ``managed`` (currently ``now``) while this toggle is the
        innermost: a parameter it left live shows its current value, one it froze what it recorded,
        one the optimizers took on since its current value."""
        assert self._managed is not None and self._vals is not None and self._plan is not None
        recorded = {id(p): v for p, v in zip(self._managed, self._vals)}
        live = {id(p) for p, mine in zip(self._managed, self._plan.own_mask) if mine}
        return tuple(n if id(p) in live else recorded.get(id(p), n) for p, n in zip(managed, now))

    def _nest(self) -> None:
        """Entered while a statement toggle of the module was open (``toggle_optimizer`` not yet
        untoggled, or Lightning's ``toggled_optimizer``): the block nests inside it as inside a block.

        The toggle made at the call was Lightning's flat one (a statement toggle inside a statement
        toggle stays exactly Lightning's); entering turns it into the nested toggle from the user's view
        (a parameter the statement left live shows its value at the call, one it froze what the
        statement recorded), undone on leaving: the state found at the call comes back, and the
        statement's record. Only the parameters of this block's optimizer whose view differs from what
        the call left are written (what an override of ``toggle_optimizer`` did after ``super()`` stays)."""
        assert self._outer is not None and self._managed is not None and self._plan is not None
        assert self._state is not None and self._vals is not None
        outer, live, own = self._outer
        recorded = {id(p): v for p, v in outer.items()}
        managed, found = self._managed, self._vals  # flat: the values found at the call
        user = tuple(n if id(p) in live else recorded.get(id(p), n) for p, n in zip(managed, found))
        write = [(p, want) for p, want, was, mine in zip(managed, user, found, self._plan.own_mask)
                 if mine and want is not was]
        # From here on, leaving restores what was found at the call, and the statement's record
        self._entry, self._prev_record, self._nested = found, outer, True
        self._state.stack.append(self)
        self._state.flat_record, self._state.flat_own = id(outer), own  # the statement is the one open
        self._vals, self._record = user, dict(zip(managed, user))
        _assign([p for p, _ in write], [v for _, v in write])
        self._module.__dict__[_RECORD] = self._record

    # -- the block ---------------------------------------------------------------------------

    def __enter__(self) -> _OptT:
        if self._phase == _UNTOGGLED:
            raise RuntimeError(
                "this toggle was undone or superseded before its block started (untoggle_optimizer ran); "
                "enter it where it is made: `with self.toggle_optimizer(opt):`; nothing was changed"
            )
        if self._phase != _MADE:
            raise RuntimeError(
                "this toggle was already used: a toggle object is single-use, write "
                "`with self.toggle_optimizer(opt):` for each block; nothing was changed"
            )
        state = self._state
        assert state is not None
        if self._module.__dict__.get(_RECORD) is not self._record or (
            self._nested and (not state.stack or state.stack[-1] is not self)
        ):
            raise RuntimeError(
                "this toggle was undone or superseded before its block started; enter it where it is "
                "made: `with self.toggle_optimizer(opt):`; nothing was changed"
            )
        try:
            if self._step and not _STEP_HOOK:  # (registered when a Lightning is patched, as a rule)
                _watch_steps()
            if _LOOKED_UP:
                _watch_class_exit(self)
            self._phase = _OPEN
            if self._step:
                _STEPPING.append(self)
            if self._outer is not None:
                self._nest()
            elif not self._nested:
                state.stack.append(self)
            if self._sync is not None:
                # Without gradient sync (DDP micro-batches) the block runs inside the strategy's
                # no_sync, entered here and left on every exit.
                self._sync = self._sync()
                # One line: no interrupt falls between entering the context and recording its exit
                _, self._sync_exit = self._sync.__enter__(), [self._sync.__exit__]
            if self._zero_grad:
                self._optimizer.zero_grad()  # type: ignore[union-attr]
            return self._optimizer  # type: ignore[return-value]
        except BaseException:
            _quietly(self._leave, retry=False)  # the error in flight propagates (an interrupt too)
            raise

    if TYPE_CHECKING:

        def __exit__(
            self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
        ) -> Literal[False]: ...

    def _exit(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        """``__exit__``: step on a clean exit, then untoggle, whatever happens; never swallow."""
        optimizer = self._optimizer
        if self._phase == _MADE or optimizer is None:
            if exc_type is not None:
                return False  # never replace an exception in flight
            raise RuntimeError("this toggle's block is not open")
        try:
            if exc_type is None and self._step:
                if self._stepped:
                    raise _double_step(optimizer)
                optimizer.step()  # type: ignore[attr-defined]
        except BaseException:
            _quietly(self._leave, retry=False)  # step's error propagates, not one of the untoggle's
            raise
        # Already closed when an enclosing block that ended first unwound it (a generator holding a
        # block): its untoggle is done, _close does nothing more.
        if exc_type is None:
            self._leave()
        else:
            _quietly(self._leave, retry=False)  # the body's exception propagates unchanged
        self._optimizer = None
        return False  # never swallow

    def _exit_dropped(self, ref: weakref.ref[Any]) -> None:
        # The with statement let go of its __exit__ while the block was entered and not yet closed
        # (_close clears _state last).
        if self._guard is ref and self._phase != _MADE and self._state is not None:
            self._close()

    # -- leaving -----------------------------------------------------------------------------
    #
    # Every step below but the call of the module's own untoggle_optimizer is idempotent and marks
    # itself done only once done, so that an interrupt (Ctrl-C) at any line, even the first of a
    # function, where no try of its own can catch it, is made good by a retry: _surely's, or at the
    # latest the _ExitGuard's when the with statement ends.

    def _leave(self) -> None:
        """Untoggle as ``finally: self.untoggle_optimizer(opt)`` would, then resume gradient sync.

        Where the module's class overrides ``untoggle_optimizer``, that method is called, once (its
        ``super().untoggle_optimizer`` reaches toggleshim's, which closes this block); an override that
        never reaches it leaves ``requires_grad`` as it made it, and toggleshim only lets the block go
        (with the toggles left open inside it: no write, their records put back).
        Otherwise toggleshim's exact untoggle runs, retried until done.
        """
        error: BaseException | None = None
        module, state = self._module, self._state
        if state is not None and self._phase != _CLOSED and overrides(module, "untoggle_optimizer"):
            state.exiting = self
            try:
                module.untoggle_optimizer(self._optimizer)
            except BaseException as e:  # raised below, once toggleshim's bookkeeping is done
                error = e
            finally:
                state.exiting = None
            if self._phase != _CLOSED:  # the override did not call super().untoggle_optimizer
                try:
                    _surely(self._unwind, False)
                except BaseException as e:
                    error = _first(error, e)
        try:
            _surely(self._close)
        except BaseException as e:
            error = _first(error, e)
        if error is not None:
            raise error

    def _close(self) -> None:
        """Untoggle, unwinding first the toggles left open above this one; gradient sync resumes."""
        error: BaseException | None = None
        try:
            try:
                self._unwind()
            except BaseException as e:
                error = e
                with contextlib.suppress(Exception):
                    self._unwind()  # interrupted or failed partway: once more, to completion
        finally:
            if self._sync_exit:
                try:
                    # Taken and called in one line: called once, as a with statement calls __exit__,
                    # even when it raises, and no interrupt falls between taking it and calling it.
                    self._sync_exit.pop()(None, None, None)
                except BaseException as e:
                    error = _first(error, e)
        if error is not None:
            raise error
        self._state = self._guard = self._sync = None

    def _unwind(self, write: bool = True) -> None:
        """Undo this toggle and every toggle still open above it, innermost first; one that fails does
        not stop the others (the first error propagates after). ``write=False``: they are let go without
        writing ``requires_grad`` (the module's own untoggle_optimizer had its say), records put back."""
        stack = self._state.stack if self._state is not None else []
        if stack and stack[-1] is self:  # the innermost, as usual
            self._undo(write)
            stack.pop()
            return
        at = next((i for i, t in enumerate(stack) if t is self), len(stack))
        error: BaseException | None = None
        for t in stack[at:][::-1] or [self]:
            try:
                t._undo(write)
            except BaseException as e:  # re-raised below, after the others
                error = _first(error, e)
        del stack[at:]
        if error is not None:
            raise error

    def _undo(self, write: bool = True) -> None:
        """Untoggle this toggle alone (once more if interrupted or failed partway), then let go.
        ``write=False``: only a nested toggle's record is put back."""
        if self._phase >= _CLOSED:  # closed, or untoggled as a statement
            return
        untoggle = (self._untoggle_nested if self._nested else self._untoggle_flat) if write else self._forget
        try:
            try:
                untoggle()
            except BaseException:
                with contextlib.suppress(Exception):
                    untoggle()
                raise
        finally:
            self._let_go()

    def _let_go(self) -> None:
        """Closed: everything but the optimizer (its step may still come) and the state goes."""
        if self in _STEPPING:  # first: an interrupt before _phase is set makes the retry come back here
            _STEPPING.remove(self)
        self._phase = _CLOSED
        self._module = self._inner = self._plan = self._layout = self._managed = None
        self._vals = self._entry = self._record = self._prev_record = self._outer = None

    def _forget(self) -> None:
        if self._nested:
            _put_record(self._module, self._prev_record)
        elif self._state is not None:
            self._state.flat_record = 0  # closed: the record left behind is no open statement toggle

    def _untoggle_flat(self) -> None:
        """Lightning's ``untoggle_optimizer`` after this flat toggle. Idempotent.

        While the optimizers' lists and the record are what the toggle left (the record's keys are the
        managed parameters in order, its values the very bools recorded), the plan says what to restore,
        without Lightning's tensor-keyed lookups. Otherwise (the user edited either), Lightning's own
        untoggle, over the current lists and record.
        """
        module = self._module
        opts = module.trainer.optimizers
        layout, managed, vals = self._layout, self._managed, self._vals
        assert self._plan is not None and layout is not None and managed is not None and vals is not None
        record = module.__dict__.get(_RECORD)
        now = _read(opts)
        if (
            len(now) == len(layout)
            and all(map(is_, now, layout))  # the same optimizers, so the toggled one at the same places
            and type(record) is dict  # not .__class__, which a subclass can fake
            and len(record) == len(managed)
            and all(map(is_, record, managed))
            and all(map(is_, record.values(), vals))  # not ==: 1 == True, which Lightning's write refuses
        ):
            restore = self._plan.restore
            try:
                _assign(restore(managed), restore(vals))
            finally:  # closed even when a write is refused: no statement toggle is open
                self._state.flat_record = 0  # type: ignore[union-attr]
        else:
            try:
                _lightning_untoggle(module, opts, self._optimizer, self._inner)
            finally:
                self._state.flat_record = 0  # type: ignore[union-attr]
        # Lightning assigns through nn.Module.__setattr__, which stores a dict in __dict__ (10x slower).
        module.__dict__[_RECORD] = {}

    def _untoggle_nested(self) -> None:
        assert self._managed is not None and self._entry is not None
        try:
            _assign(self._managed, self._entry)
        finally:  # a refused write does not keep the nested record: the enclosing block's is back
            _put_record(self._module, self._prev_record)

    def _untoggle_statement(self) -> None:
        """``untoggle_optimizer`` called on a nested statement toggle: close it as a nested block."""
        _surely(self._close)
        self._optimizer = None

    def __repr__(self) -> str:
        if self._phase == _UNTOGGLED:
            return "<toggleshim.Toggle untoggled (holds nothing)>"
        if self._phase == _CLOSED and self._optimizer is None:
            return "<toggleshim.Toggle closed (holds nothing)>"
        status = ("toggled", "open", "closed")[self._phase]
        return f"<toggleshim.Toggle {status} optimizer={type(self._optimizer).__name__}>"


class _ExitGuard:
    """``Toggle.__exit__``: the method ``Toggle._exit``, watched while its block is open.

    A Ctrl-C can land before the first line of any Python ``__exit__`` runs, where no ``try`` of its
    own can catch it: the block would stay open for good. So the ``__exit__`` handed to a ``with``
    statement is a fresh bound method, watched through a weak reference: the ``with`` statement lets
    go of it when the block ends, by any path, and if the block is still open then, it is closed
    (``Toggle._exit_dropped``). Looking ``__exit__`` up otherwise (``getattr``, a debugger) is harmless:
    only the last lookup before the block opens is watched, and only while the block is open.
    """

    def __get__(self, toggle: Toggle[Any] | None, cls: Any = None) -> Any:
        if toggle is None:
            # Toggle.__exit__ (contextlib.ExitStack.enter_context looks it up so, right before calling
            # __enter__, and keeps it until it calls it): a fresh function, which the next __enter__ in
            # this thread watches as it watches the with statement's, if it is still held by then.
            def __exit__(
                toggle: Toggle[Any], exc_type: type[BaseException] | None, exc: BaseException | None,
                tb: TracebackType | None,
            ) -> Literal[False]:
                return toggle._exit(exc_type, exc, tb)

            _LOOKED_UP[:] = [(threading.get_ident(), weakref.ref(__exit__))]
            return __exit__
        exit_fn = MethodType(Toggle._exit, toggle)
        if toggle._phase == _MADE:  # the with statement about to enter; once open, no other getattr counts
            toggle._guard = weakref.ref(exit_fn, toggle._exit_dropped)
        return exit_fn


# The __exit__ last looked up on the class (thread, weak reference): see _ExitGuard.
_LOOKED_UP: list[tuple[int, weakref.ref[Any]]] = []


def _watch_class_exit(toggle: Toggle[Any]) -> None:
    """``toggle`` is entered: watch the ``Toggle.__exit__`` looked up just before, if it is still held
    (by ``ExitStack``) and the with statement handed it no ``__exit__`` of its own."""
    ident, ref = _LOOKED_UP.pop()
    exit_fn = ref()
    if exit_fn is not None and ident == threading.get_ident() and toggle._guard is None:
        toggle._guard = weakref.ref(exit_fn, toggle._exit_dropped)


if not TYPE_CHECKING:
    Toggle.__exit__ = _ExitGuard()


def _toggle_optimizer(
    self: Any, optimizer: _OptT, zero_grad: bool = True, step: bool = True, sync_grad: bool = True
) -> Toggle[_OptT]:
    """The toggle (``Toggle(...)``, ``toggle(...)``); ``_patch`` installs copies of this very function as
    ``toggle_optimizer`` (no wrapper call on every toggle). ``self``: the LightningModule."""
    module = self
    if type(zero_grad) is not bool or type(step) is not bool or type(sync_grad) is not bool:
        _check_flags(zero_grad=zero_grad, step=step, sync_grad=sync_grad)
    trainer = module.trainer  # Lightning's own RuntimeError when not attached to a Trainer
    opts = trainer.optimizers
    inner = _unwrap(optimizer) if "_optimizer" in getattr(optimizer, "__dict__", ()) else optimizer
    sync = None if sync_grad else getattr(trainer.strategy, "block_backward_sync", None)
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

    t: Toggle[_OptT] = _new(Toggle)
    t._module, t._state, t._optimizer, t._inner = module, state, optimizer, inner
    t._zero_grad, t._step, t._sync, t._sync_exit = zero_grad, step, sync, None
    t._plan, t._layout, t._managed, t._phase = plan, layout, managed, _MADE
    t._guard, t._stepped = None, False
    namespace = module.__dict__
    stack = state.stack
    t._nested = nested = bool(stack)
    previous = namespace.get(_RECORD, _MISSING)
    if not nested:  # exactly Lightning's toggle: freeze all but the toggled optimizer's parameters
        t._entry = t._prev_record = None
        # A statement toggle still open (a record not yet emptied by an untoggle): entered, this
        # toggle nests inside it (Toggle._nest); as a statement it stays Lightning's flat toggle.
        t._outer = _open_statement(state, previous) if state.flat_record == id(previous) and previous else None
        t._vals = vals
        # The record, dict(zip(managed, vals)): a copy of the plan's last one when the values are the
        # same (a copy reuses the stored hashes; building one calls Tensor.__hash__, in Python, for every
        # parameter, the largest cost of a toggle at 1,000 parameters and more).
        if vals != plan.last_vals:
            plan.last_record, plan.last_vals = dict(zip(managed, vals)), vals
        t._record = record = plan.last_record.copy()  # type: ignore[union-attr]
        free = plan.free(managed)
        try:
            for param in free:  # stops at a failing write: the rollback below puts every one back
                param.requires_grad = False
            namespace[_RECORD] = record  # as Lightning's assignment through nn.Module.__setattr__
            state.flat, state.flat_record, state.flat_own = _ref(t), id(record), plan.own_mask
            return t
        except BaseException:  # all or nothing: put back what was written
            _quietly(_rollback, module, free, plan.free(vals), previous)
            raise
    # Nested: the same toggle from the user's view (see Toggle._user_view), undone on leaving.
    t._entry, t._outer = vals, None
    t._prev_record = previous
    t._vals = user = stack[-1]._user_view(managed, vals)
    t._record = record = dict(zip(managed, user))
    targets = [want if mine else False for want, mine in zip(user, plan.own_mask)]
    try:
        _assign(managed, targets)
        namespace[_RECORD] = record
        stack.append(t)  # a nested toggle is open from here on, entered or not
        return t
    except BaseException:  # all or nothing
        if stack and stack[-1] is t:
            stack.pop()
        _quietly(_rollback, module, managed, vals, previous)
        raise


def _rollback(module: Any, params: Sequence[Any], values: Sequence[bool], previous: Any) -> None:
    """Undo a toggle that could not complete: ``params`` get ``values`` back, the record ``previous``."""
    _assign(params, values)
    _put_record(module, previous)


def _put_record(module: Any, record: Any) -> None:
    if record is _MISSING:
        module.__dict__.pop(_RECORD, None)
    else:
        module.__dict__[_RECORD] = record


def _open_statement(state: _ModuleState, record: Any) -> tuple[Any, frozenset[int], tuple[bool, ...]]:
    """The statement toggle still open: ``record`` is the very record the module's last flat toggle
    stored (toggleshim's untoggle forgets it). Its record, the ids of the parameters its optimizer
    holds (none when the record's keys were edited in number: then every recorded parameter shows what
    it recorded), and which of the record's keys those are."""
    own = state.flat_own
    live = frozenset(id(p) for p, mine in zip(record, own) if mine) if len(record) == len(own) else frozenset()
    return record, live, own


def toggle(
    module: Any, optimizer: _OptT, zero_grad: bool = True, step: bool = True, sync_grad: bool = True
) -> Toggle[_OptT]:
    """Typed entry point: ``with toggleshim.toggle(self, opt):`` is ``with self.toggle_optimizer(opt):``.

    Static checkers read Lightning's ``toggle_optimizer(...) -> None`` and reject it in a ``with``;
    this function has the precise type. It works whether or not the patch is installed; on a
    Lightning whose toggle code toggleshim has not verified it is that Lightning's own sequence, as
    the patched method is there (docs/guard.md). Where the module's class overrides
    ``toggle_optimizer``, that override makes the toggle (see :func:`_through_own_toggle`).
    """
    if overrides(module, "toggle_optimizer"):
        return _through_own_toggle(module, optimizer, zero_grad, step, sync_grad)
    fallback = route(module)
    if fallback is not None:  # typed as a Toggle: the same context manager, yielding the optimizer
        return cast("Toggle[_OptT]", fallback(module, optimizer, zero_grad, step, sync_grad))
    return _toggle_optimizer(module, optimizer, zero_grad, step, sync_grad)


def _through_own_toggle(module: Any, optimizer: _OptT, zero_grad: bool, step: bool, sync_grad: bool) -> Toggle[_OptT]:
    """``toggle()`` on a module whose class overrides ``toggle_optimizer``: the block is the manual
    sequence with the module's own methods. The override is called as ``self.toggle_optimizer(opt)``
    is (the optimizer alone). When it returns the toggle ``super().toggle_optimizer`` made, that is the
    block, with these flags; otherwise (it returns None, or makes its own toggle) the block runs
    ``zero_grad``, the body, ``step`` and ``self.untoggle_optimizer(opt)`` around it."""
    from toggleshim._fallback import FallbackToggle, module_untoggle

    _check_flags(zero_grad=zero_grad, step=step, sync_grad=sync_grad)
    # read before the toggle: a failing strategy changes nothing
    sync = None if sync_grad else getattr(module.trainer.strategy, "block_backward_sync", None)
    made = module.toggle_optimizer(optimizer)
    if (
        isinstance(made, (Toggle, FallbackToggle))
        and made._phase == _MADE
        and made._module is module
        and made._optimizer is optimizer
    ):
        made._zero_grad, made._step, made._sync = zero_grad, step, sync
        return cast("Toggle[_OptT]", made)
    own = FallbackToggle(module, optimizer, module_untoggle, None, zero_grad, step, sync)
    return cast("Toggle[_OptT]", own)


def _same(a: Any, b: Any) -> bool:
    return a is b or _unwrap(a) is _unwrap(b)


def _untoggled(module: Any, optimizer: Any) -> bool:
    """toggleshim's ``untoggle_optimizer(optimizer)``, before Lightning's: True when it closed a toggle
    of toggleshim's instead (then Lightning's untoggle must not run).

    * the exit of a block of this module calls the module's own ``untoggle_optimizer`` (a subclass's
      override), which reached this through ``super()``: that block is closed;
    * a statement toggle made inside a block: closed as a nested block;
    * otherwise Lightning's untoggle runs, and the last flat toggle's object lets go of everything.
    """
    state = _state_if_any(module)
    if state is None:
        return False
    exiting = state.exiting
    if exiting is not None and _same(exiting._optimizer, optimizer):
        _surely(exiting._unwind)
        return True
    stack = state.stack
    if stack:
        top = stack[-1]
        if top._phase == _MADE and _same(top._optimizer, optimizer):
            top._untoggle_statement()
            return True
        state.flat_record = 0  # Lightning's untoggle empties the record: no statement toggle is open
        return False
    ref, state.flat, state.flat_record = state.flat, None, 0
    flat = ref() if ref is not None else None
    if flat is not None and flat._phase == _MADE:  # untoggled as a statement: it holds nothing more
        flat._let_go()
        flat._optimizer = flat._state = flat._sync = None
        flat._phase = _UNTOGGLED
    return False


# -- a step inside a block that steps on exit --------------------------------------------------------

_STEP_HOOK: list[Any] = []  # the handle of torch's global step hook, once registered


def _watch_steps() -> None:
    """Register :func:`_note_step` with torch (once, at the first block that steps on exit): every
    optimizer's ``step()`` then tells the open blocks over it. Nothing is added to the optimizers."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _STEP_HOOK.append(register_optimizer_step_post_hook(_note_step))


# The open blocks that step on exit (entered, not yet closed): _note_step marks them.
_STEPPING: list[Toggle[Any]] = []


def _note_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's post-step hook: an open block over ``optimizer`` has seen it step."""
    for t in _STEPPING:
        if t._inner is optimizer:
            t._stepped = True


def _double_step(optimizer: Any) -> RuntimeError:
    return RuntimeError(
        f"toggleshim: {type(optimizer).__name__}.step() ran inside `with self.toggle_optimizer(opt):`, which "
        "steps on a clean exit too (step=True): the optimizer would step twice. Pass step=False to keep "
        "your own step() call, or drop the call and let the block step. The block did not step again; "
        "it untoggled."
    )


# Namespaces whose code is handed to dynamo once a Lightning flavour is loaded (_keep_dynamo_out).
_DYNAMO_PENDING: list[dict[str, Any]] = []


def _keep_dynamo_out(namespace: dict[str, Any], now: bool = False) -> None:
    """Have torch.compile run our code eagerly instead of tracing it (at no cost outside compile).

    Traced, the toggle's bookkeeping becomes dynamo guards that can break compilation; ``skip_code``
    makes dynamo graph-break at our calls, as Lightning's newest source does with
    ``torch.compiler.disable`` on its own toggle (whose wrapper costs ~3 us a call).

    While no Lightning flavour is loaded, the namespace waits in ``_DYNAMO_PENDING``: importing torch's
    dynamo costs seconds (``import toggleshim`` before Lightning, the CLI), and no block runs before a
    Lightning is loaded; ``_patch`` hands the waiting ones over (:func:`_mark_for_dynamo`) whenever it
    installs, from the import of a flavour on, Lightning having loaded torch by then.
    """
    if not now and not any(name in sys.modules for name in _CORE_MODULES):
        _DYNAMO_PENDING.append(namespace)
        return
    try:
        from torch._dynamo.eval_frame import skip_code
    except Exception:  # pragma: no cover - a torch without dynamo
        return
    file = namespace["__file__"]

    def codes(code: Any) -> Any:
        yield code
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                yield from codes(const)

    for value in list(namespace.values()):
        members = vars(value).values() if isinstance(value, type) else (value,)
        for member in members:
            parts = (member.fget, member.fset, member.fdel) if isinstance(member, property) else (member,)
            for part in parts:
                fn = getattr(part, "__func__", part)
                fn = getattr(fn, "__wrapped__", fn)  # under functools.wraps (a contextmanager): ours
                code = getattr(fn, "__code__", None)
                # by file, not __module__: a wrapper made elsewhere (contextlib's, for one) says ours
                if getattr(code, "co_filename", None) == file:
                    for inner in codes(code):
                        skip_code(inner)


def _mark_for_dynamo() -> None:
    """Hand every waiting namespace to dynamo (a Lightning flavour is loaded)."""
    while _DYNAMO_PENDING:
        _keep_dynamo_out(_DYNAMO_PENDING.pop(), now=True)


_keep_dynamo_out(globals())
