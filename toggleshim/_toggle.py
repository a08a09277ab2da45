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

import contextlib
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

__all__ = ["Toggle", "toggle"]

_OptT = TypeVar("_OptT")
_requires_grad = attrgetter("requires_grad")
_RECORD = "_param_requires_grad_state"  # Lightning's name for the record, on the module
_MISSING: Any = object()
_new = object.__new__  # a Toggle is made without calling Toggle.__new__ (which toggles)
_MADE, _OPEN, _CLOSED = 0, 1, 2  # a Toggle's phase: toggled (statement, or not entered yet), in its block, undone

# Markers in a layout (see _layout).
_TOGGLED: Any = object()
_END: Any = object()
_OUTSIDE: Any = object()


def _layout(opts: Sequence[Any], optimizer: Any, inner: Any) -> list[Any]:
    """All that Lightning's toggle and untoggle read of the optimizers, in their order.

    Every optimizer's parameters, each optimizer's ended by ``_END`` and preceded by ``_TOGGLED`` when
    it is the toggled one (``is optimizer or is inner``, Lightning's test). An ``optimizer`` that is
    not one of ``opts`` adds ``_OUTSIDE`` and its own parameters at the end.
    """
    seq: list[Any] = []
    outside = True
    for opt in opts:
        if opt is optimizer or opt is inner:
            seq.append(_TOGGLED)
            outside = False
        for group in opt.param_groups:
            seq += group["params"]
        seq.append(_END)
    if outside:
        seq.append(_OUTSIDE)
        for group in optimizer.param_groups:
            seq += group["params"]
    return seq


def _picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``lambda seq: tuple(seq[i] for i in indices)`` at C speed (``itemgetter`` has odd arities)."""
    if not indices:
        return lambda seq: ()
    if len(indices) == 1:
        (only,) = indices
        return lambda seq: (seq[only],)
    return itemgetter(*indices)


class _Plan:
    """How a toggle reads one layout: which items are the managed parameters (first occurrences, in
    Lightning's order), which of them it freezes, which the untoggle restores.

    It depends only on *which positions of the layout hold the same object*, so it is cached by the
    layout's ``id``s (all alive while compared, hence distinct) and holds integers only: a plan keeps
    nothing alive. Built once per layout; the hot path is then a few C-level passes.
    """

    __slots__ = ("free", "managed", "own_mask", "restore")

    def __init__(self, layout: Sequence[Any]) -> None:
        first: dict[int, int] = {}  # id -> index among the managed parameters
        managed_at: list[int] = []  # their positions in the layout
        own: set[int] = set()  # ids of the toggled optimizer's parameters
        restored: set[int] = set()  # ids of the parameters Lightning's untoggle restores
        toggled = outside = False
        for pos, item in enumerate(layout):
            if item is _TOGGLED:
                toggled = True
            elif item is _END:
                toggled = False
            elif item is _OUTSIDE:
                outside = True
            elif outside:
                own.add(id(item))
            else:
                key = id(item)
                if key not in first:
                    first[key] = len(managed_at)
                    managed_at.append(pos)
                (own if toggled else restored).add(key)
        order = [id(layout[pos]) for pos in managed_at]
        self.managed = _picker(managed_at)  # layout -> the managed parameters
        self.own_mask = tuple(key in own for key in order)  # which managed ones are the toggled optimizer's
        self.free = _picker([i for i, key in enumerate(order) if key not in own])  # managed -> frozen ones
        self.restore = _picker([i for i, key in enumerate(order) if key in restored])  # managed -> restored


class _ModuleState:
    """Per-module bookkeeping: cached plans and the stack of open blocks (and nested statement toggles)."""

    __slots__ = ("module", "plans", "stack")

    def __init__(self, module: weakref.ref[Any]) -> None:
        self.module = module  # weak: a module's state never keeps it alive
        self.plans: dict[tuple[int, ...], _Plan] = {}
        self.stack: list[Toggle[Any]] = []


_MAX_PLANS = 16  # per module; optimizers come and go (e.g. re-created by each fit): keep it bounded

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


_WRAPPER_MODULES = ("lightning.pytorch.core.optimizer", "pytorch_lightning.core.optimizer")


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer behind a ``LightningOptimizer`` (of either flavour), else itself.

    The classes are looked up where Lightning defines them, at each call: no registry to keep in step
    (or to lose on a reload), and no cache of the class Lightning makes for every wrapper.
    """
    for name in _WRAPPER_MODULES:
        cls = getattr(sys.modules.get(name), "LightningOptimizer", None)
        if cls is not None and isinstance(optimizer, cls):
            return optimizer._optimizer
    return optimizer


# -- validation and messages ---------------------------------------------------------------------


def _describe(obj: Any) -> str:
    """``module.Class (repr)`` for an error message; never raises (a broken ``__repr__`` is bad input too)."""
    cls = type(obj)
    try:
        text = repr(obj)
    except Exception:
        text = "<repr failed>"
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{cls.__module__}.{cls.__qualname__} ({text})"


def _check_flags(**flags: Any) -> None:
    for flag, value in flags.items():
        if type(value) is not bool:
            raise TypeError(
                f"toggle_optimizer(): {flag} must be True or False (a bool), got {_describe(value)}; "
                "nothing was changed"
            )


def _check_optimizer(optimizer: Any) -> None:
    """Reject anything that is not an optimizer, before a single ``requires_grad`` changes."""
    try:
        groups = optimizer.param_groups
        if isinstance(groups, (list, tuple)) and all(isinstance(g, dict) and "params" in g for g in groups):
            return
    except Exception:
        pass  # no readable param_groups: not an optimizer, said below
    raise TypeError(
        "toggle_optimizer() expects an optimizer (a torch.optim.Optimizer or the LightningOptimizer "
        f"that self.optimizers() returns), got {_describe(optimizer)}; nothing was changed"
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


def _new_plan(module: Any, opts: Sequence[Any], optimizer: Any, layout: list[Any]) -> _Plan:
    """The plan for ``layout``; raises, having changed nothing, if ``optimizer`` cannot be toggled."""
    import torch

    _check_optimizer(optimizer)
    for item in layout:
        if item is not _TOGGLED and item is not _END and item is not _OUTSIDE and not isinstance(item, torch.Tensor):
            raise TypeError(
                f"toggle_optimizer(): an optimizer holds {_describe(item)} where a parameter (a tensor) "
                "belongs; nothing was changed"
            )
    plan = _Plan(layout)
    managed = {id(p) for p in plan.managed(layout)}
    strangers = [p for p in _own_params(layout) if id(p) not in managed]
    if strangers:
        # Lightning would raise a bare KeyError after freezing everything.
        raise ValueError(
            f"toggle_optimizer(): the optimizer holds {_param_name(module, strangers[0])}, which none of "
            f"trainer.optimizers holds ({len(strangers)} such parameter(s)); pass an optimizer returned by "
            "configure_optimizers (self.optimizers()); nothing was changed"
        )
    return plan


def _own_params(layout: list[Any]) -> list[Any]:
    """The toggled optimizer's parameters as the layout lists them."""
    own: list[Any] = []
    toggled = False
    for item in layout:
        if item is _TOGGLED or item is _OUTSIDE:
            toggled = True
        elif item is _END:
            toggled = False
        elif toggled:
            own.append(item)
    return own


# -- writing requires_grad -----------------------------------------------------------------------


def _assign(params: Iterable[Any], values: Iterable[bool]) -> None:
    """``p.requires_grad = v`` for every pair; a write that fails does not stop the others. The first
    error propagates after the last write."""
    error: BaseException | None = None
    for p, v in zip(params, values):
        try:
            p.requires_grad = v
        except BaseException as e:  # re-raised below, after the other writes
            if error is None:
                error = e
    if error is not None:
        raise error


def _surely(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)``, and once more if anything interrupts it (Ctrl-C between two lines, a failing
    write), so that it completes before the error propagates: ``fn`` must be idempotent. The first
    error propagates unchanged; an error of the second run is dropped (the first already says it)."""
    try:
        fn(*args)
    except BaseException:
        with contextlib.suppress(BaseException):
            fn(*args)
        raise


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


def _untoggle_flat(module: Any, plan: _Plan, key: tuple[int, ...], optimizer: Any, inner: Any, vals: Any) -> None:
    """Lightning's ``untoggle_optimizer(optimizer)`` after a flat toggle over the layout ``key`` that
    recorded ``vals`` (``inner``: the torch optimizer in ``optimizer``). Idempotent.

    While the optimizers' lists and the record are what the toggle left (the record's keys are the
    managed parameters, by identity and in order, its values the very bools recorded), the plan says
    what to restore, without Lightning's tensor-keyed lookups. Otherwise (the user edited either),
    Lightning's own untoggle, over the current lists and record.
    """
    opts = module.trainer.optimizers
    record = module.__dict__.get(_RECORD)
    layout = _layout(opts, optimizer, inner)
    ids = tuple(map(id, layout))
    if (
        ids == key
        and type(record) is dict  # not .__class__, which a subclass can fake
        and tuple(map(id, record)) == plan.managed(ids)
        and all(map(is_, record.values(), vals))  # not ==: 1 == True, which Lightning's write would refuse
    ):
        managed = plan.managed(layout)
        _assign(plan.restore(managed), plan.restore(vals))
    else:
        _lightning_untoggle(module, opts, optimizer, inner)
    # Lightning assigns through nn.Module.__setattr__, which stores a dict in __dict__ (10x slower).
    module.__dict__[_RECORD] = {}


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
        "_entry",
        "_inner",
        "_key",
        "_managed",
        "_module",
        "_nested",
        "_optimizer",
        "_phase",
        "_plan",
        "_prev_record",
        "_record",
        "_state",
        "_step",
        "_sync",
        "_sync_entered",
        "_vals",
        "_zero_grad",
    )

    _entry: tuple[bool, ...] | None  # nested: every managed requires_grad found at the toggle
    _inner: Any  # the torch optimizer in _optimizer
    _key: tuple[int, ...] | None  # the layout's ids at the toggle
    _managed: tuple[Any, ...] | None  # the managed parameters at the toggle
    _module: Any
    _nested: bool
    _optimizer: _OptT | None
    _phase: int
    _plan: _Plan | None
    _prev_record: Any  # nested: the record to put back on leaving
    _record: dict[Any, bool] | None  # the record this toggle stored
    _state: _ModuleState | None
    _step: bool
    _sync: Any  # sync_grad=False: the strategy's block_backward_sync, then the context it made
    _sync_entered: bool
    _vals: tuple[bool, ...] | None  # the user's view of every managed parameter (flat: the record's values)
    _zero_grad: bool

    def __new__(
        cls, module: Any, optimizer: _OptT, zero_grad: bool = True, step: bool = True, sync_grad: bool = True
    ) -> Toggle[_OptT]:
        return _toggle_optimizer(module, optimizer, zero_grad, step, sync_grad)

    # -- nesting ----------------------------------------------------------------------------

    def _user_view(self, managed: tuple[Any, ...], now: tuple[bool, ...]) -> tuple[bool, ...]:
        """The user's ``requires_grad`` for ``managed`` (currently ``now``) while this toggle is the
        innermost: a parameter it left live shows its current value, one it froze what it recorded,
        one the optimizers took on since its current value."""
        assert self._managed is not None and self._vals is not None and self._plan is not None
        recorded = {id(p): v for p, v in zip(self._managed, self._vals)}
        live = {id(p) for p, mine in zip(self._managed, self._plan.own_mask) if mine}
        return tuple(n if id(p) in live else recorded.get(id(p), n) for p, n in zip(managed, now))

    # -- the block ---------------------------------------------------------------------------

    def __enter__(self) -> _OptT:
        if self._phase != _MADE:
            raise RuntimeError(
                "this toggle was already used: a toggle object is single-use, write "
                "`with self.toggle_optimizer(opt):` for each block; nothing was changed"
            )
        state = self._state
        assert state is not None
        if self._module.__dict__.get(_RECORD) is not self._record or (self._nested and state.stack[-1] is not self):
            raise RuntimeError(
                "this toggle was undone or superseded before its block started; enter it where it is "
                "made: `with self.toggle_optimizer(opt):`; nothing was changed"
            )
        try:
            self._phase = _OPEN
            if not self._nested:
                state.stack.append(self)
            if self._sync is not None:
                # Without gradient sync (DDP micro-batches) the block runs inside the strategy's
                # no_sync, entered here and left on every exit.
                self._sync = self._sync()
                self._sync.__enter__()
                self._sync_entered = True
            if self._zero_grad:
                self._optimizer.zero_grad()  # type: ignore[union-attr]
        except BaseException:
            self._close()
            raise
        return self._optimizer  # type: ignore[return-value]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        optimizer = self._optimizer
        if self._phase == _MADE or optimizer is None:
            if exc_type is not None:
                return False  # never replace an exception in flight
            raise RuntimeError("this toggle's block is not open")
        try:
            if exc_type is None and self._step:
                optimizer.step()  # type: ignore[attr-defined]
        finally:
            # Already closed when an enclosing block that ended first unwound it (a generator holding
            # a block): its untoggle is done, nothing more to do.
            try:
                self._close()
            finally:
                self._optimizer = None
        return False  # never swallow

    # -- leaving -----------------------------------------------------------------------------

    def _close(self) -> None:
        """Untoggle, unwinding first the toggles left open above this one; gradient sync resumes.
        Safe to call again, and completes even if interrupted (every step is idempotent)."""
        try:
            _surely(self._unwind)
        finally:
            sync, self._sync = self._sync, None
            if self._sync_entered:
                self._sync_entered = False
                # Resumed as a clean exit: its own `finally` restores gradient sync; the exception in
                # flight (if any) keeps propagating from our caller, unchanged.
                sync.__exit__(None, None, None)

    def _unwind(self) -> None:
        state = self._state
        if state is not None and self in state.stack:  # by identity: Toggle has no __eq__
            stack = state.stack
            while stack:
                top = stack[-1]
                top._undo()
                stack.pop()  # after the undo: an interrupt in between leaves it to be undone again
                if top is self:
                    break
        self._undo()

    def _undo(self) -> None:
        if self._phase == _CLOSED:
            return
        module, plan = self._module, self._plan
        assert plan is not None
        if self._nested:
            assert self._managed is not None and self._entry is not None
            _assign(self._managed, self._entry)
            _put_record(module, self._prev_record)
        else:
            assert self._key is not None
            _untoggle_flat(module, plan, self._key, self._optimizer, self._inner, self._vals)
        self._phase = _CLOSED
        # Let go of everything but the optimizer (its step may still come) and the sync context.
        self._module = self._inner = self._plan = self._state = self._key = self._managed = None
        self._vals = self._entry = self._record = self._prev_record = None

    def _untoggle_statement(self) -> None:
        """``untoggle_optimizer`` called on a nested statement toggle: close it as a nested block."""
        try:
            _surely(self._unwind)
        finally:
            self._optimizer = None

    def __repr__(self) -> str:
        status = ("toggled", "open", "closed")[self._phase]
        return f"<toggleshim.Toggle {status} optimizer={type(self._optimizer).__name__}>"


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
    inner = _unwrap(optimizer)
    sync = None if sync_grad else getattr(trainer.strategy, "block_backward_sync", None)
    try:
        layout = _layout(opts, optimizer, inner)
    except Exception:
        _check_optimizer(optimizer)  # a clear TypeError for a non-optimizer, else the original error
        raise
    state = _state(module)
    key = tuple(map(id, layout))
    plan = state.plans.get(key)
    if plan is None:
        plan = _new_plan(module, opts, optimizer, layout)  # validates: raises before any change
        if len(state.plans) >= _MAX_PLANS:
            state.plans.clear()
        state.plans[key] = plan
    managed: tuple[Any, ...] = plan.managed(layout)
    vals: tuple[bool, ...] = tuple(map(_requires_grad, managed))

    t: Toggle[_OptT] = _new(Toggle)
    t._module, t._state, t._optimizer, t._inner = module, state, optimizer, inner
    t._zero_grad, t._step, t._sync, t._sync_entered = zero_grad, step, sync, False
    t._plan, t._key, t._managed, t._phase = plan, key, managed, _MADE
    namespace = module.__dict__
    stack = state.stack
    t._nested = nested = bool(stack)
    previous = namespace.get(_RECORD, _MISSING)
    if not nested:  # exactly Lightning's toggle: freeze all but the toggled optimizer's parameters
        t._entry = t._prev_record = None
        t._vals = vals
        t._record = record = dict(zip(managed, vals))
        free = plan.free(managed)
        try:
            _assign(free, repeat(False))
            namespace[_RECORD] = record  # as Lightning's assignment through nn.Module.__setattr__
            return t
        except BaseException:  # all or nothing: put back what was written
            _surely(_rollback, module, free, plan.free(vals), previous)
            raise
    # Nested: the same toggle from the user's view (see Toggle._user_view), undone on leaving.
    t._entry = vals
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
        _surely(_rollback, module, managed, vals, previous)
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


def toggle(
    module: Any, optimizer: _OptT, zero_grad: bool = True, step: bool = True, sync_grad: bool = True
) -> Toggle[_OptT]:
    """Typed entry point: ``with toggleshim.toggle(self, opt):`` is ``with self.toggle_optimizer(opt):``.

    Static checkers read Lightning's ``toggle_optimizer(...) -> None`` and reject it in a ``with``;
    this function has the precise type. It works whether or not the patch is installed.
    """
    return _toggle_optimizer(module, optimizer, zero_grad, step, sync_grad)


def _open_statement_toggle(module: Any, optimizer: Any) -> Toggle[Any] | None:
    """The nested statement toggle that ``untoggle_optimizer(optimizer)`` should close, if any."""
    state = _state_if_any(module)
    if state is None or not state.stack:
        return None
    top = state.stack[-1]
    if top._phase != _MADE:
        return None
    if top._optimizer is optimizer or _unwrap(top._optimizer) is _unwrap(optimizer):
        return top
    return None


def _keep_dynamo_out(namespace: dict[str, Any]) -> None:
    """Have torch.compile run our code eagerly instead of tracing it (at no cost outside compile).

    Traced, the toggle's bookkeeping becomes dynamo guards that can break compilation; ``skip_code``
    makes dynamo graph-break at our calls, as Lightning's newest source does with
    ``torch.compiler.disable`` on its own toggle (whose wrapper costs ~3 us a call).
    """
    try:
        from torch._dynamo.eval_frame import skip_code
    except Exception:  # pragma: no cover - a torch without dynamo
        return
    module = namespace["__name__"]

    def codes(code: Any) -> Any:
        yield code
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                yield from codes(const)

    for value in list(namespace.values()):
        members = vars(value).values() if isinstance(value, type) else (value,)
        for member in members:
            fn = getattr(member, "__func__", member)
            if getattr(fn, "__module__", None) == module and hasattr(fn, "__code__"):
                for code in codes(fn.__code__):
                    skip_code(code)


_keep_dynamo_out(globals())
