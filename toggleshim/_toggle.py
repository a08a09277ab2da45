"""The toggle: Lightning's ``toggle_optimizer`` done exactly, fast, and as a context manager.

Where the reference lives: ``toggleshim.testing.model`` is the plain-Python model of these
semantics; this file is the fast implementation the property suite checks against it and
against Lightning's own methods.

Semantics in one place (see README, "Semantics"):

* *Flat* toggle (no block of this module is open): exactly Lightning's ``toggle_optimizer``.
  Every parameter held by ``trainer.optimizers`` is recorded and frozen, then the toggled
  optimizer's parameters get their recorded value back; the record is stored as
  ``module._param_requires_grad_state``. The flat block's exit is exactly Lightning's
  ``untoggle_optimizer`` (parameters of the *other* optimizers get their recorded value back).
* *Nested* toggle (inside an open block): the same toggle, but taken from the *user's* view,
  not from the frozen state around it; leaving restores exactly the state found on entry.
* Nothing changes before the input is validated; exceptions are never swallowed.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from itertools import chain
from operator import attrgetter, is_, itemgetter
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

__all__ = ["Toggle", "toggle"]

_OptT = TypeVar("_OptT")
_requires_grad = attrgetter("requires_grad")

# LightningOptimizer classes of every installed flavour, filled by ``_patch`` (unwrapping needs them).
_LIGHTNING_OPTIMIZERS: list[type] = []


def _picker(indices: Sequence[int]) -> Callable[[tuple[bool, ...]], tuple[bool, ...]]:
    """A C-speed ``lambda vals: tuple(vals[i] for i in indices)`` (``itemgetter`` has odd arities)."""
    if not indices:
        return lambda vals: ()
    if len(indices) == 1:
        (only,) = indices
        return lambda vals: (vals[only],)
    return itemgetter(*indices)


_new = object.__new__
_MADE, _OPEN, _CLOSED = 0, 1, 2  # a Toggle's phase: toggled (a statement, or not entered yet), in its block, undone

# The flat block's kernels: the C ones (toggleshim/_speedups.c) when built and not switched off with
# TOGGLESHIM_PURE_PYTHON=1, else the Python ones below (the reference: the C ones do exactly this).
_speedups: Any = None
if os.environ.get("TOGGLESHIM_PURE_PYTHON", "") in ("", "0"):
    try:
        from toggleshim import _speedups
    except ImportError:  # built without a compiler: the Python kernels, same behaviour
        _speedups = None
KERNELS = "python" if _speedups is None else "C"  # reported by `python -m toggleshim check`

# In a layout: the next optimizer is the toggled one (Lightning's untoggle skips it); the end of one
# optimizer's parameters. Plain sentinels, shared with the C kernels.
_TOGGLED: Any = object() if _speedups is None else _speedups.TOGGLED
_END: Any = object() if _speedups is None else _speedups.END


def _layout(opts: Sequence[Any], optimizer: Any, inner: Any) -> list[Any]:
    """All that toggling ``optimizer`` (``inner``: the torch optimizer in it) reads from ``opts``:
    every optimizer's parameters in Lightning's iteration order, each optimizer's ended by ``_END``
    and preceded by ``_TOGGLED`` when it is the toggled one (``is optimizer or is inner``, Lightning's
    test). Two layouts are the same iff they are identical item by item; then Lightning's toggle and
    untoggle do the same on both (which optimizer *objects* hold the lists does not matter to them).
    """
    seq: list[Any] = []
    for opt in opts:
        if opt is optimizer or opt is inner:
            seq.append(_TOGGLED)
        for group in opt.param_groups:
            seq += group["params"]
        seq.append(_END)
    return seq


def _py_enter_flat(
    opts: Sequence[Any],
    optimizer: Any,
    inner: Any,
    seq: tuple[Any, ...],
    managed: tuple[Any, ...],
    free: tuple[Any, ...],
) -> list[Any] | tuple[bool, ...]:
    """A flat toggle's work for a cached plan (``seq``, ``managed``, ``free``: the plan's).

    Reads the layout once. If it is not ``seq``, returns it (a list; nothing changed: the caller
    builds a plan for it). Else reads every managed parameter's ``requires_grad`` (returned, a tuple)
    and freezes the ``free`` ones in order, as Lightning does (an error stops there, as in Lightning).
    """
    now = _layout(opts, optimizer, inner)
    if len(now) != len(seq) or not all(map(is_, now, seq)):
        return now
    vals = tuple(map(_requires_grad, managed))
    for p in free:  # as Lightning: every managed parameter but the toggled ones, frozen
        p.requires_grad = False
    return vals


def _py_leave_flat(
    opts: Sequence[Any],
    optimizer: Any,
    inner: Any,
    record: Any,
    vals: tuple[bool, ...],
    seq: tuple[Any, ...],
    last_vals: tuple[bool, ...] | None,
    last_record: dict[Any, bool],
    restore: tuple[Any, ...],
    restore_vals: tuple[bool, ...],
) -> bool:
    """Lightning's untoggle after a flat toggle that recorded ``vals`` and handed out a copy of
    ``last_record`` (the plan's, as are ``seq``, ``last_vals``, ``restore``, ``restore_vals``), when
    nothing it reads changed: then gives ``restore`` the values ``restore_vals`` and returns True.
    Returns False, having changed nothing, when anything did (the caller takes the long way).

    The check, with no ``Tensor.__hash__`` call and no iteration object:

    * the layout (read once) is still ``seq``: all that Lightning's untoggle reads of the optimizers;
    * ``last_record == record`` (``dict_equal``, in C) looks every managed parameter up in the record
      exactly as Lightning's ``param in record`` / ``record[param]`` do: the same stored hash
      (``Tensor.__hash__`` is ``id``), the same probing and key comparison; each value found equals the
      recorded one;
    * the record's values are the very bools recorded, in order: so none is a non-bool equal to one
      (``1 == True``: Lightning's untoggle would raise "requires_grad must be a bool"), and each value
      found above *is* the recorded one.
    """
    if record.__class__ is not dict or vals != last_vals:
        return False
    try:
        now = _layout(opts, optimizer, inner)
        if (
            len(now) != len(seq)
            or not all(map(is_, now, seq))
            or last_record != record  # each parameter found, with an equal value
            or not all(map(is_, record.values(), vals))  # the values: the very bools recorded, in order
        ):
            return False
    except Exception:  # unreadable lists, a failing comparison: the long way raises what Lightning's does
        return False
    for p, was in zip(restore, restore_vals):
        p.requires_grad = was
    return True


_enter_flat: Callable[..., list[Any] | tuple[bool, ...]] = (
    _py_enter_flat if _speedups is None else _speedups.enter_flat
)
_leave_flat: Callable[..., bool] = _py_leave_flat if _speedups is None else _speedups.leave_flat


class _Plan:
    """Everything about toggling one optimizer that depends only on *which* parameters are where.

    Built once per (module, optimizer, parameter layout) and reused while the layout is unchanged,
    so the hot path is a handful of C-level passes instead of Lightning's tensor-keyed dict work.
    The layout is every parameter each of ``trainer.optimizers`` holds, by identity, in order, and
    which optimizer is the toggled one (``seq``, see ``_layout``; held: no parameter in it can die and
    have its id reused while the plan exists). How parameters are split into groups does not matter.
    """

    __slots__ = (
        "free",
        "inner_id",
        "last_record",
        "last_vals",
        "managed",
        "outside",
        "own_mask",
        "pick_restore",
        "restore",
        "restore_vals",
        "seq",
    )

    def __init__(
        self,
        seq: tuple[Any, ...],
        inner_id: int,
        outside: tuple[Any, ...] | None,
        managed: tuple[Any, ...],
        own_mask: tuple[bool, ...],
        restore_idx: list[int],
    ) -> None:
        self.seq = seq
        self.inner_id = inner_id
        self.outside = outside  # the toggled optimizer's parameters when it is not a trainer optimizer
        self.managed = managed
        self.own_mask = own_mask
        free_idx = [i for i, mine in enumerate(own_mask) if not mine]
        self.free = tuple(managed[i] for i in free_idx)
        self.restore = tuple(managed[i] for i in restore_idx)
        self.pick_restore = _picker(restore_idx)  # record positions = managed positions
        self.last_vals: tuple[bool, ...] | None = None  # the values of the last record built, and
        self.last_record: dict[Any, bool] = {}  # that record (handed out as copies), and
        self.restore_vals: tuple[bool, ...] = ()  # the values Lightning's untoggle restores from it

    def outside_changed(self, inner: Any) -> bool:
        """Whether ``inner``, an optimizer outside ``trainer.optimizers``, no longer holds the parameters
        this plan was built for (the rest of a plan's check is inline in ``_toggle_optimizer``)."""
        outside = self.outside
        if outside is None:
            return False
        own = _params_of(inner)
        return len(own) != len(outside) or not all(map(is_, own, outside))

    def record(self, vals: tuple[bool, ...]) -> dict[Any, bool]:
        """Lightning's ``_param_requires_grad_state`` for ``vals``; a dict copy when unchanged.

        Copying a dict reuses its stored hashes; building one calls ``Tensor.__hash__`` (Python)
        once per parameter, which is most of Lightning's own cost.
        """
        if vals != self.last_vals:
            self.last_record = dict(zip(self.managed, vals))
            self.last_vals = vals
            self.restore_vals = self.pick_restore(vals)
        return self.last_record.copy()


class _ModuleState:
    """Per-module bookkeeping: cached plans and the stack of open (or nested statement) toggles."""

    __slots__ = ("module", "plans", "stack")

    def __init__(self, module: weakref.ref[Any]) -> None:
        self.module = module  # a weak reference: a module's state never keeps it alive
        self.plans: dict[int, _Plan] = {}
        self.stack: list[Toggle[Any]] = []


# Keyed by id(module), which stays valid while the module lives: its weak reference's callback drops
# the entry when it dies, and every lookup checks the reference (a dict get, no weakref created:
# a WeakKeyDictionary lookup costs ~10x more, on every toggle).
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


# class -> whether it is a LightningOptimizer (of either flavour); cleared when _patch registers one.
_IS_WRAPPER: dict[type, bool] = {}


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer behind a ``LightningOptimizer`` (of either flavour), else itself."""
    cls = optimizer.__class__
    wrapped = _IS_WRAPPER.get(cls)
    if wrapped is None:
        wrapped = _IS_WRAPPER[cls] = any(issubclass(cls, known) for known in _LIGHTNING_OPTIMIZERS)
    return optimizer._optimizer if wrapped else optimizer


def _params_of(optimizer: Any) -> tuple[Any, ...]:
    return tuple(chain.from_iterable([group["params"] for group in optimizer.param_groups]))


def _check_optimizer(optimizer: Any) -> None:
    """Reject anything that is not an optimizer before a single ``requires_grad`` changes."""
    groups = getattr(optimizer, "param_groups", None)
    if isinstance(groups, (list, tuple)) and all(isinstance(g, dict) and "params" in g for g in groups):
        return
    raise TypeError(
        "toggle_optimizer() expects an optimizer (a torch.optim.Optimizer or the LightningOptimizer "
        f"that self.optimizers() returns), got {type(optimizer).__module__}.{type(optimizer).__qualname__}"
        f" ({optimizer!r:.80}); nothing was changed"
    )


def _check_flags(**flags: Any) -> None:
    for flag, value in flags.items():
        if not isinstance(value, (bool, int)):
            raise TypeError(f"toggle_optimizer(): {flag} must be True or False, got {value!r}")


def _param_name(module: Any, param: Any) -> str:
    for name, p in module.named_parameters(remove_duplicate=False):
        if p is param:
            return f"parameter {name!r}"
    return f"an unnamed parameter of shape {tuple(param.shape)} (not a parameter of {type(module).__name__})"


def _new_plan(
    module: Any, state: _ModuleState, seq: list[Any], opts: Sequence[Any], optimizer: Any, inner: Any
) -> _Plan:
    """A new plan for ``optimizer`` (``inner``: the torch optimizer in it) over the layout ``seq`` of
    ``opts``, cached; raises (changing nothing) if the optimizer cannot be toggled.

    Plans are cached by the id of the object passed (a ``LightningOptimizer`` and its torch
    optimizer are toggled alike but are different objects to Lightning's untoggle); ``Toggle``
    reuses one only for the very same layout (an *identity* check: never ``==`` on tensors).
    """
    _check_optimizer(optimizer)
    per_opt = [_params_of(opt) for opt in opts]
    index: dict[int, int] = {}
    managed: list[Any] = []
    for p in chain.from_iterable(per_opt):
        if id(p) not in index:
            index[id(p)] = len(managed)
            managed.append(p)
    # The toggled optimizer's parameters: a trainer optimizer's are part of the layout already.
    positions = [k for k, o in enumerate(opts) if o is inner]
    own = per_opt[positions[0]] if positions else _params_of(inner)
    strangers = [p for p in own if id(p) not in index]
    if strangers:
        raise ValueError(
            f"toggle_optimizer(): the optimizer holds {_param_name(module, strangers[0])}, which none of "
            f"trainer.optimizers holds ({len(strangers)} such parameter(s)); pass an optimizer returned by "
            "configure_optimizers (self.optimizers()); nothing was changed"
        )
    own_ids = {id(p) for p in own}
    # Lightning's untoggle restores every optimizer's parameters but the toggled one's (by identity,
    # a LightningOptimizer matching its inner optimizer); a parameter shared with it is restored too.
    restored: set[int] = set()
    for params, o in zip(per_opt, opts):
        if o is not optimizer and o is not inner:
            restored.update(id(p) for p in params)
    plan = _Plan(
        tuple(seq),
        id(inner),
        None if positions else own,
        tuple(managed),
        tuple(id(p) in own_ids for p in managed),
        [i for i, p in enumerate(managed) if id(p) in restored],
    )
    if len(state.plans) > 64:  # optimizers come and go (e.g. re-created each fit); keep it bounded
        state.plans.clear()
    state.plans[id(optimizer)] = plan
    return plan


def _lightning_untoggle(opts: Sequence[Any], optimizer: Any, inner: Any, record: Any) -> None:
    """``LightningModule.untoggle_optimizer`` as Lightning writes it (``inner``: the torch optimizer in
    ``optimizer``; its record is ``record``)."""
    for opt in opts:
        if opt is not optimizer and opt is not inner:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in record:
                        param.requires_grad = record[param]


def _untoggle_flat(module: Any, plan: _Plan, optimizer: Any, inner: Any, vals: tuple[bool, ...]) -> None:
    """Lightning's ``untoggle_optimizer(optimizer)`` after a flat toggle that recorded ``vals`` and
    handed out a copy of ``plan.last_record`` (``inner``: the torch optimizer in ``optimizer``).

    The other optimizers' parameters get the value the record holds for them *now* (the user may have
    edited it): from the plan while the layout and the record are what the toggle left
    (``_leave_flat``), else the long way, over the current lists and record.
    """
    opts = module.trainer.optimizers
    namespace = module.__dict__
    record = namespace.get("_param_requires_grad_state")
    last = plan.last_record
    if not _leave_flat(
        opts, optimizer, inner, record, vals, plan.seq, plan.last_vals, last, plan.restore, plan.restore_vals
    ):
        _lightning_untoggle(opts, optimizer, inner, record)
    namespace["_param_requires_grad_state"] = {}


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
        "_vals",
        "_zero_grad",
    )

    _entry: tuple[bool, ...] | None
    _inner: Any
    _module: Any
    _nested: bool
    _optimizer: _OptT | None
    _phase: int
    _plan: _Plan | None
    _prev_record: Any
    _record: dict[Any, bool] | None
    _state: _ModuleState | None
    _step: bool
    _sync: Any
    _vals: tuple[bool, ...] | None
    _zero_grad: bool

    def __new__(
        cls, module: Any, optimizer: _OptT, zero_grad: bool = True, step: bool = True, sync_grad: bool = True
    ) -> Toggle[_OptT]:
        return _toggle_optimizer(module, optimizer, zero_grad, step, sync_grad)

    # -- nesting ----------------------------------------------------------------------------

    def _user_view(self, plan: _Plan, now: tuple[bool, ...]) -> tuple[bool, ...]:
        mine_plan = self._plan
        assert mine_plan is not None and self._vals is not None
        mine, theirs = mine_plan.managed, plan.managed
        if len(mine) != len(theirs) or not all(map(is_, mine, theirs)):  # the optimizers changed in between
            recorded = {id(p): v for p, v in zip(mine_plan.managed, self._vals)}
            live = {id(p) for p, m in zip(mine_plan.managed, mine_plan.own_mask) if m}
            return tuple(n if id(p) in live else recorded.get(id(p), n) for p, n in zip(plan.managed, now))
        return tuple(n if m else v for n, m, v in zip(now, mine_plan.own_mask, self._vals))

    # -- the block ---------------------------------------------------------------------------

    def __enter__(self) -> _OptT:
        module = self._module
        if self._phase != _MADE:
            raise RuntimeError(
                "this toggle was already used: a toggle object is single-use, write "
                "`with self.toggle_optimizer(opt):` for each block; nothing was changed"
            )
        state = self._state
        assert state is not None
        current = module.__dict__.get("_param_requires_grad_state")
        if current is not self._record or (self._nested and state.stack[-1] is not self):
            raise RuntimeError(
                "this toggle was undone or superseded before its block started; enter it where it is "
                "made: `with self.toggle_optimizer(opt):`; nothing was changed"
            )
        self._phase = _OPEN
        if not self._nested:
            state.stack.append(self)
        try:
            if self._sync is not None:
                self._sync = self._sync()
                self._sync.__enter__()
            if self._zero_grad:
                self._optimizer.zero_grad()  # type: ignore[union-attr]
        except BaseException:
            self._close(state)
            raise
        return self._optimizer  # type: ignore[return-value]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if self._phase != _OPEN:
            raise RuntimeError("this toggle's block is not open")
        try:
            if exc_type is None and self._step:
                self._optimizer.step()  # type: ignore[union-attr]
        finally:
            state = self._state
            assert state is not None
            stack = state.stack
            if stack and stack[-1] is self and not self._nested and self._sync is None:
                # The usual block (flat, nothing left open inside, no gradient sync to resume): the
                # untoggle without the general path's calls (this is every block's exit).
                stack.pop()
                self._phase = _CLOSED
                module, plan, vals = self._module, self._plan, self._vals
                optimizer, inner = self._optimizer, self._inner
                self._module = self._optimizer = self._inner = self._plan = self._state = None
                self._vals = self._record = None
                assert plan is not None and vals is not None
                _untoggle_flat(module, plan, optimizer, inner, vals)
            else:
                self._close(state)
        return False  # never swallow

    # -- leaving -----------------------------------------------------------------------------

    def _close(self, state: _ModuleState) -> None:
        """Untoggle (unwinding nested statement toggles left open above us) and let go of everything."""
        stack = state.stack
        sync, self._sync = self._sync, None
        try:
            if stack and stack[-1] is self:  # the innermost toggle: the usual case
                stack.pop()
                self._undo()
            elif self in stack:
                while stack:
                    top = stack.pop()
                    top._undo()
                    if top is self:
                        break
            else:  # a nested toggle already unwound by its own untoggle_optimizer
                self._undo()
        finally:
            if sync is not None and hasattr(sync, "__exit__"):
                # Resume it as a clean exit: its own `finally` restores gradient sync; the exception
                # in flight (if any) keeps propagating from our caller, unchanged.
                sync.__exit__(None, None, None)

    def _undo(self) -> None:
        if self._phase == _CLOSED:
            return
        self._phase = _CLOSED
        module, plan = self._module, self._plan
        assert plan is not None and self._vals is not None
        try:
            if self._nested:
                assert self._entry is not None
                for p, was in zip(plan.managed, self._entry):
                    if p.requires_grad is not was:
                        p.requires_grad = was
                module.__dict__["_param_requires_grad_state"] = self._prev_record
            else:
                _untoggle_flat(module, plan, self._optimizer, self._inner, self._vals)
        finally:
            self._module = self._optimizer = self._inner = self._plan = self._state = None
            self._vals = self._entry = self._record = self._prev_record = None

    def _untoggle_statement(self) -> None:
        """``untoggle_optimizer`` called on a nested statement toggle: close it as a nested block."""
        state = self._state
        if state is not None and state.stack and state.stack[-1] is self:
            state.stack.pop()
        self._undo()

    def __repr__(self) -> str:
        status = ("toggled", "open", "closed")[self._phase]
        return f"<toggleshim.Toggle {status} optimizer={type(self._optimizer).__name__}>"


def _toggle_optimizer(
    self: Any, optimizer: _OptT, zero_grad: bool = True, step: bool = True, sync_grad: bool = True
) -> Toggle[_OptT]:
    """The toggle (``Toggle(...)``, ``toggle(...)``); ``_patch`` installs copies of this very function as
    ``toggle_optimizer`` (no wrapper call: this is every toggle's path). ``self``: the LightningModule."""
    module = self
    if zero_grad.__class__ is not bool or step.__class__ is not bool or sync_grad.__class__ is not bool:
        _check_flags(zero_grad=zero_grad, step=step, sync_grad=sync_grad)
        zero_grad, step, sync_grad = bool(zero_grad), bool(step), bool(sync_grad)
    trainer = module.trainer  # Lightning's own RuntimeError when not attached to a Trainer
    state = _STATES.get(id(module))  # _state(module), inlined: this is every toggle's path
    if state is None or state.module() is not module:
        state = _state(module)
    wrapped = _IS_WRAPPER.get(optimizer.__class__)
    inner = optimizer if wrapped is False else _unwrap(optimizer)  # _unwrap, inlined for a torch optimizer
    opts = trainer.optimizers
    # Without gradient sync (DDP micro-batches) the block runs inside the strategy's no_sync,
    # entered with the block and left on every exit (toggle_model also leaves the toggle on errors).
    sync = None if sync_grad else getattr(trainer.strategy, "block_backward_sync", None)
    stack = state.stack
    plan = state.plans.get(id(optimizer))
    try:
        if plan is not None and not stack and plan.outside is None and plan.inner_id == id(inner):
            # The usual toggle: flat, a cached plan. Reads the layout once; toggles if it is the plan's.
            got = _enter_flat(opts, optimizer, inner, plan.seq, plan.managed, plan.free)
        else:
            got = _layout(opts, optimizer, inner)
    except Exception:
        _check_optimizer(optimizer)  # a clear TypeError for a non-optimizer, else the original error
        raise
    if got.__class__ is tuple:
        vals: tuple[bool, ...] = got
        assert plan is not None
    else:  # the layout, read; nothing changed yet
        seq: list[Any] = got  # type: ignore[assignment]
        if (  # a cached plan is reused only for the very layout it was built for (by identity)
            plan is None
            or len(seq) != len(plan.seq)
            or plan.inner_id != id(inner)
            or not all(map(is_, seq, plan.seq))
            or plan.outside_changed(inner)
        ):
            plan = _new_plan(module, state, seq, opts, optimizer, inner)  # validates; raises before any change
        # -- validated: from here on we change things --
        vals = tuple(map(_requires_grad, plan.managed))
        if not stack:
            for p in plan.free:  # as Lightning: every managed parameter but the toggled ones, frozen
                p.requires_grad = False
    t: Toggle[_OptT] = _new(Toggle)
    t._module = module
    t._state = state
    t._optimizer = optimizer
    t._inner = inner
    t._zero_grad = zero_grad
    t._step = step
    t._sync = sync
    t._plan = plan
    t._phase = _MADE
    if not stack:
        t._nested = False
        t._entry = None
        user = vals
        # plan.record(vals), inlined for the usual case: the same values as last time
        record = plan.last_record.copy() if vals == plan.last_vals else plan.record(vals)
    else:
        # Nested: toggle from the user's view. Parameters the enclosing toggle left live show the
        # user's current wish; the ones it froze show what it recorded.
        outer = stack[-1]
        t._nested = True
        t._entry = vals
        t._prev_record = module.__dict__.get("_param_requires_grad_state")
        user = outer._user_view(plan, vals)
        for p, mine, now, want in zip(plan.managed, plan.own_mask, vals, user):
            target = want if mine else False
            if now is not target:
                p.requires_grad = target
        record = dict(zip(plan.managed, user))
        stack.append(t)
    t._vals = user
    t._record = record
    # Lightning assigns through nn.Module.__setattr__, which stores a dict in __dict__ (10x slower).
    module.__dict__["_param_requires_grad_state"] = record
    return t


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

    Traced, the toggle's bookkeeping (a weak dictionary of modules) becomes a dynamo guard that can
    break compilation; ``skip_code`` makes dynamo graph-break at our calls, as Lightning's newest
    source does with ``torch.compiler.disable`` on its own toggle (whose wrapper costs ~3 us a call).
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
