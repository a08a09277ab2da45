"""The block: ``with self.toggle_optimizer(opt, **flags):``, one class for every way a block is made.

What a block does, in the order of the README's semantics table::

    toggle                             # at the call: toggleshim's exact toggle, or the module's own
    enter:  no-sync context (sync_grad=False); opt.zero_grad() (zero_grad)
    exit:   opt.step() (step, clean exit only); untoggle (always); no-sync context left (always)

The toggle and the untoggle it runs are one of two kinds, chosen when the toggle is made:

* **toggleshim's exact core** (``_toggle.py``): where the code is verified and the class overrides
  neither method. The untoggle is the core's undo; where the class overrides ``untoggle_optimizer``,
  the exit calls that override, whose ``super()`` reaches toggleshim's untoggle (:func:`_untoggled`).
* **the module's own methods**: a toggle made by the module's own ``toggle_optimizer`` (an override
  that returns no toggle of ours, or an unverified Lightning's own method: the *fallback*). The exit
  calls ``self.untoggle_optimizer(opt)``; nesting on the fallback is refused with a clear error
  (Lightning's own nested toggles freeze the inner optimizer's parameters for good).

The flags are declared once, in :class:`Flags` and :data:`FLAGS`; everything else reads them there.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Mapping
from types import MethodType, TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypedDict, TypeVar, cast

from toggleshim import _toggle
from toggleshim._compile import keep_dynamo_out
from toggleshim._ours import describe, overrides, route
from toggleshim._toggle import _Made, _state_if_any, _unwrap, same
from toggleshim._writes import first, quietly, surely

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11; mypy brings this one

__all__ = ["FLAGS", "Flags", "Toggle", "toggle"]

_OptT = TypeVar("_OptT")
_new = object.__new__  # a Toggle is made without calling Toggle.__new__ (which toggles)
_ref = weakref.ref


# -- the flags ----------------------------------------------------------------------------------


class Flags(TypedDict, total=False):
    """The block's flags, keyword arguments of every entry point (exactly ``True`` or ``False``)."""

    zero_grad: bool
    step: bool
    sync_grad: bool


#: Each flag's default and what it does; the order of the documentation. A new flag is one entry here,
#: one in :class:`Flags`, and what the block does with it (``Toggle.__enter__`` / ``Toggle._exit``).
FLAGS: dict[str, tuple[bool, str]] = {
    "zero_grad": (True, "call ``optimizer.zero_grad()`` on entering the block."),
    "step": (True, "call ``optimizer.step()`` when the block ends without an exception."),
    "sync_grad": (True, "``False`` skips the DDP gradient all-reduce inside the block (gradient accumulation "
                  "micro-batches), restored on every exit."),
}
_DEFAULTS: dict[str, bool] = {name: default for name, (default, _) in FLAGS.items()}


def _flags_of(given: Mapping[str, Any]) -> dict[str, bool]:
    """Every flag's value: ``given`` (each exactly ``True`` or ``False``, a ``bool``: not ``1``,
    ``numpy.True_``, a tensor) over the defaults. Raises ``TypeError`` naming the flag, before anything
    changes."""
    for name, value in given.items():
        if name not in FLAGS:
            raise TypeError(
                f"toggle_optimizer() got an unexpected keyword argument {name!r} (the block's flags: "
                f"{', '.join(FLAGS)}); nothing was changed"
            )
        if type(value) is not bool:
            raise TypeError(
                f"toggle_optimizer(): {name} must be True or False (a bool), got {describe(value)}; "
                "nothing was changed"
            )
    return {**_DEFAULTS, **given}


# -- the block ----------------------------------------------------------------------------------

# A block's phase: toggled (a statement, or not entered yet), in its block, the module's own untoggle
# called (its exit under way), closed; or untoggled as a statement (it holds nothing more)
_MADE, _OPEN, _LEFT, _CLOSED, _UNTOGGLED = range(5)


class Toggle(Generic[_OptT]):
    """What ``self.toggle_optimizer(optimizer, zero_grad=True, step=True, sync_grad=True)`` returns.

    The toggle has already happened when you hold this object. Use it as a statement (Lightning's
    behaviour, pair it with ``untoggle_optimizer``) or as a block::

        with self.toggle_optimizer(opt) as opt:   # zero_grad() on entry
            self.manual_backward(loss)
        # clean exit: opt.step(), then untoggle; any exception: no step, untoggle, re-raised

    A toggle object is single-use. After the block, or after ``untoggle_optimizer`` when used as a
    statement, it holds no reference to the module, the optimizer or any parameter.
    """

    __slots__ = (
        "__weakref__",
        "_flags",
        "_guard",
        "_inner",
        "_label",
        "_made",
        "_module",
        "_optimizer",
        "_phase",
        "_stepped",
        "_sync",
        "_sync_exit",
    )

    _flags: dict[str, bool]
    _guard: weakref.ref[Any] | None  # the __exit__ the with statement holds, watched (see _ExitGuard)
    _inner: Any  # the torch optimizer in _optimizer
    _label: str | None  # the fallback: the Lightning it runs, for messages (its blocks do not nest)
    _made: _Made | None  # toggleshim's toggle; None: the module's own toggle made it
    _module: Any
    _optimizer: _OptT | None
    _phase: int
    _stepped: bool  # the block's optimizer stepped while the block was open (_note_step)
    _sync: Any  # sync_grad=False: the strategy's block_backward_sync, then the context it made
    _sync_exit: list[Callable[..., Any]] | None  # the entered context's __exit__, until it is called

    def __new__(cls, module: Any, optimizer: _OptT, **flags: Unpack[Flags]) -> Toggle[_OptT]:
        return toggle(module, optimizer, **flags)  # the fallback too, as toggle()

    # -- entering ---------------------------------------------------------------------------

    def __enter__(self) -> _OptT:
        self._check_enterable()
        made, flags = self._made, self._flags
        try:
            self._phase = _OPEN  # first: from here on, leaving untoggles (the module's own toggle too)
            if self._label is not None:  # the fallback: Lightning's own nested toggles are not exact
                _OPEN_BLOCKS[id(self._module)] = self
            if flags["step"]:
                if not _STEP_HOOK:  # (registered when a Lightning is patched, as a rule)
                    _watch_steps()
                _STEPPING.append(self)
            if _LOOKED_UP:
                _watch_class_exit(self)
            if made is not None:
                # the toggle is the block's from here on (one made while a statement toggle was open
                # nests inside it: _Flat.nested); held first, so that leaving undoes what it opens
                self._made = made = made.for_block()
                made.open()
            if self._sync is not None:
                # Without gradient sync (DDP micro-batches) the block runs inside the strategy's
                # no_sync, entered here and left on every exit.
                self._sync = self._sync()
                # One line: no interrupt falls between entering the context and recording its exit
                _, self._sync_exit = self._sync.__enter__(), [self._sync.__exit__]
            if flags["zero_grad"]:
                self._optimizer.zero_grad()  # type: ignore[union-attr]
            return self._optimizer  # type: ignore[return-value]
        except BaseException:
            quietly(self._leave, retry=False)  # the error in flight propagates (an interrupt too)
            raise

    def _check_enterable(self) -> None:
        """Refuse, before anything changes, a block that cannot start."""
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
        made = self._made
        if made is not None:
            if not made.enterable():
                raise RuntimeError(
                    "this toggle was undone or superseded before its block started; enter it where it is "
                    "made: `with self.toggle_optimizer(opt):`; nothing was changed"
                )
        elif self._label is not None and id(self._module) in _OPEN_BLOCKS:  # made as a statement in a block
            raise _nesting_error(self._label)

    # -- leaving ----------------------------------------------------------------------------

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
            if exc_type is None and self._flags["step"]:
                if self._stepped:
                    raise _double_step(optimizer)
                optimizer.step()  # type: ignore[attr-defined]
        except BaseException:
            quietly(self._leave, retry=False)  # step's error propagates, not one of the untoggle's
            raise
        if exc_type is None:
            self._leave()
        else:
            quietly(self._leave, retry=False)  # the body's exception propagates unchanged
        return False  # never swallow

    def _leave(self) -> None:
        """``finally: self.untoggle_optimizer(opt)``, then gradient sync resumes.

        The module's own ``untoggle_optimizer`` is called, once, where the toggle is the module's own,
        or where its class overrides the method (its ``super().untoggle_optimizer`` reaches
        toggleshim's, which undoes the toggle; an override that never does leaves ``requires_grad`` as
        it made it, and toggleshim only lets the toggle go, with those left open inside it: no write).
        Otherwise toggleshim's exact untoggle runs, retried until done.
        """
        error: BaseException | None = None
        made = self._made
        if self._phase == _OPEN and (made is None or (not made.done and overrides(self._module, "untoggle_optimizer"))):
            error = self._own_untoggle(made)
        try:
            surely(self._close)
        except BaseException as e:
            error = first(error, e)
        if error is not None:
            raise error

    def _own_untoggle(self, made: _Made | None) -> BaseException | None:
        """``self.untoggle_optimizer(opt)``, once; returns its error. With toggleshim's toggle under it,
        the override's ``super()`` undoes it; one the override left is let go without writing."""
        self._phase = _LEFT  # first: an interrupt from here on never calls it a second time
        error: BaseException | None = None
        state = made.state if made is not None else None
        if state is not None:
            state.exiting = made
        try:
            self._module.untoggle_optimizer(self._optimizer)
        except BaseException as e:  # raised by _leave, once toggleshim's bookkeeping is done
            error = e
        finally:
            if state is not None:
                state.exiting = None
        if made is not None and not made.done:  # the override did not call super().untoggle_optimizer
            # ... or an interrupt stopped it first: then toggleshim's untoggle runs, writing (a Ctrl-C
            # never leaves the toggle half-undone); an override that returned, or raised an error,
            # without super() has the last word on requires_grad: let go without writing
            interrupted = error is not None and not isinstance(error, Exception)
            try:
                surely(made.unwind, interrupted)
            except BaseException as e:
                error = first(error, e)
        return error

    def _close(self) -> None:
        """toggleshim's part of every exit, idempotent: the toggle undone (first those left open above
        it, innermost first), gradient sync resumed; then the block lets go of everything."""
        if self in _STEPPING:
            _STEPPING.remove(self)
        if _OPEN_BLOCKS.get(id(self._module)) is self:
            del _OPEN_BLOCKS[id(self._module)]
        error: BaseException | None = None
        made = self._made
        try:
            if made is not None:
                try:
                    made.unwind()
                except BaseException as e:
                    error = e
                    with contextlib.suppress(Exception):
                        made.unwind()  # interrupted or failed partway: once more, to completion
        finally:
            if self._sync_exit:
                try:
                    # Taken and called in one line: called once, as a with statement calls __exit__,
                    # even when it raises, and no interrupt falls between taking it and calling it.
                    self._sync_exit.pop()(None, None, None)
                except BaseException as e:
                    error = first(error, e)
        if error is not None:
            raise error
        self._phase = _CLOSED
        if self._guard is not None:
            _GUARDS.discard(self._guard)
        self._module = self._optimizer = self._inner = self._made = self._sync = self._guard = None

    def _exit_dropped(self, ref: weakref.ref[Any]) -> None:
        # The with statement let go of its __exit__ while the block was open (an interrupt at the first
        # line of __exit__, where nothing can catch it): the block is closed now. A toggle of the
        # module's own is untoggled by its own method (there is no other); toggleshim's by its exact
        # untoggle (no user code from a weak reference's callback).
        _GUARDS.discard(ref)
        if self._guard is not ref or self._phase not in (_OPEN, _LEFT):
            return
        try:
            if self._phase == _OPEN and self._made is None:
                self._phase = _LEFT
                self._module.untoggle_optimizer(self._optimizer)
        finally:
            self._close()

    def _release(self) -> None:
        """Untoggled as a statement: the block holds nothing more."""
        if self._made is not None:
            self._made.let_go()
        self._phase = _UNTOGGLED
        self._module = self._optimizer = self._inner = self._made = self._sync = None

    def __repr__(self) -> str:
        if self._phase == _UNTOGGLED:
            return "<toggleshim.Toggle untoggled (holds nothing)>"
        if self._phase == _CLOSED and self._optimizer is None:
            return "<toggleshim.Toggle closed (holds nothing)>"
        status = ("toggled", "open", "closing", "closed")[self._phase]
        if self._label is not None:
            return f"<toggleshim fallback toggle {status} on {self._label}>"
        if self._made is None and self._phase != _CLOSED:
            return f"<toggleshim.Toggle {status} (the module's own toggle_optimizer)>"
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
            _guard(toggle, exit_fn)
        return exit_fn


# The __exit__ last looked up on the class (thread, weak reference): see _ExitGuard.
_LOOKED_UP: list[tuple[int, weakref.ref[Any]]] = []


def _watch_class_exit(toggle: Toggle[Any]) -> None:
    """``toggle`` is entered: watch the ``Toggle.__exit__`` looked up just before, if it is still held
    (by ``ExitStack``) and the with statement handed it no ``__exit__`` of its own."""
    ident, ref = _LOOKED_UP.pop()
    exit_fn = ref()
    if exit_fn is not None and ident == threading.get_ident() and toggle._guard is None:
        _guard(toggle, exit_fn)


# The watches of the open blocks' __exit__ (see _ExitGuard): held here, not only by their block. A
# weak reference's callback runs only if the reference itself outlives what it watches; where the
# exit, its block and the block's watch are garbage together (an ExitStack's frame, in the traceback
# of an interrupt at the first line of the exit it called, is a reference cycle), the garbage
# collector would free the block unclosed. From here, the watch outlives the exit and closes the
# block. It holds the block as long as the exit lives (and the exit holds the block, so: no longer).
_GUARDS: set[weakref.ref[Any]] = set()


def _guard(toggle: Toggle[Any], exit_fn: Any) -> None:
    watch = weakref.ref(exit_fn, toggle._exit_dropped)
    _GUARDS.add(watch)  # first: a watch not yet the block's only discards itself (_exit_dropped)
    toggle._guard = watch


if not TYPE_CHECKING:
    Toggle.__exit__ = _ExitGuard()


# -- making a block -----------------------------------------------------------------------------


def _block(module: Any, optimizer: Any, flags: dict[str, bool], sync: Any, made: _Made | None,
           label: str | None = None) -> Toggle[Any]:
    """The block over a toggle made: toggleshim's (``made``), or the module's own (None)."""
    t: Toggle[Any] = _new(Toggle)
    t._module, t._optimizer, t._made, t._flags, t._sync, t._label = module, optimizer, made, flags, sync, label
    t._sync_exit, t._guard, t._phase, t._stepped = None, None, _MADE, False
    if made is None:
        t._inner = _unwrap(optimizer)
    else:
        t._inner = made.inner
        made.owned_by(t)
    return t


def _toggle_optimizer(self: Any, optimizer: _OptT, **flags: Unpack[Flags]) -> Toggle[_OptT]:
    """The toggle (``Toggle(...)``, ``toggle(...)``); ``_patch`` installs copies of this very function as
    ``toggle_optimizer`` (no wrapper call on every toggle). ``self``: the LightningModule."""
    given = _flags_of(flags) if flags else _DEFAULTS
    trainer = self.trainer  # Lightning's own RuntimeError when not attached to a Trainer
    sync = None if given["sync_grad"] else getattr(trainer.strategy, "block_backward_sync", None)
    made = _block(self, optimizer, given, sync, _toggle.toggle(self, optimizer, trainer.optimizers))
    if _CATCHES:  # an override's super() call, under toggle(): see _through_own_toggle
        _catch(self, made)
    return made


def toggle(module: Any, optimizer: _OptT, **flags: Unpack[Flags]) -> Toggle[_OptT]:
    """Typed entry point: ``with toggleshim.toggle(self, opt):`` is ``with self.toggle_optimizer(opt):``.

    Static checkers read Lightning's ``toggle_optimizer(...) -> None`` and reject it in a ``with``;
    this function has the precise type. It works whether or not the patch is installed; on a
    Lightning whose toggle code toggleshim has not verified it is that Lightning's own sequence, as
    the patched method is there (docs/guard.md). Where the module's class overrides
    ``toggle_optimizer``, that override makes the toggle (see :func:`_through_own_toggle`).
    """
    if overrides(module, "toggle_optimizer"):
        return _through_own_toggle(module, optimizer, flags)
    fallback = route(module)
    if fallback is not None:  # typed as a Toggle: the same context manager, yielding the optimizer
        return cast("Toggle[_OptT]", fallback(module, optimizer, **flags))
    return _toggle_optimizer(module, optimizer, **flags)


def _through_own_toggle(module: Any, optimizer: _OptT, flags: Mapping[str, Any]) -> Toggle[_OptT]:
    """``toggle()`` on a module whose class overrides ``toggle_optimizer``: the block is the manual
    sequence with the module's own methods. The override is called as ``self.toggle_optimizer(opt)``
    is (the optimizer alone). The toggle its ``super().toggle_optimizer(opt)`` made is the block,
    with these flags, whether the override returns it or not (an override that returns None has
    only forgotten to: with Lightning's own toggle under it, blocks nested in it would freeze the
    inner optimizer's parameters for good). An override that makes no toggle of toggleshim's (it
    never calls ``super()``, or on a Lightning toggleshim has not verified) makes a block that runs
    ``zero_grad``, the body, ``step`` and ``self.untoggle_optimizer(opt)`` around its toggle."""
    given = _flags_of(flags)
    # read before the toggle: a failing strategy changes nothing
    sync = None if given["sync_grad"] else getattr(module.trainer.strategy, "block_backward_sync", None)
    catch = _Catch(module)
    ref = _ref(catch)
    try:
        _CATCHES.append(ref)
        made = module.toggle_optimizer(optimizer)
    finally:
        _CATCHES[:] = [r for r in _CATCHES if r is not ref and r() is not None]
    caught = catch.made
    if made is None and caught is not None and caught._made is not None and caught._made.enterable():
        made = caught  # the return forgotten
    if isinstance(made, Toggle) and made._phase == _MADE and made._module is module and made._optimizer is optimizer:
        made._flags, made._sync = given, sync
        return made
    return _block(module, optimizer, given, sync, None)


class _Catch:
    """The toggle an override's ``super().toggle_optimizer`` call makes, while ``toggle()`` runs the
    override (held by that call's frame alone; :data:`_CATCHES` refers to it weakly)."""

    __slots__ = ("__weakref__", "made", "module")

    made: Toggle[Any] | None

    def __init__(self, module: Any) -> None:
        self.module, self.made = module, None


# The catches of the overrides running under toggle(), innermost last (weak references: one an
# interrupt leaves behind is dead once its frame is gone)
_CATCHES: list[weakref.ref[_Catch]] = []


def _catch(module: Any, made: Toggle[Any]) -> None:
    for ref in reversed(_CATCHES):
        catch = ref()
        if catch is not None and catch.module is module:
            catch.made = made
            return


# -- the fallback: a Lightning whose toggle code toggleshim has not verified ----------------------

# id(module) -> its open fallback block. The block holds the module while open, so the id cannot be
# reused meanwhile; every exit path removes the entry.
_OPEN_BLOCKS: dict[int, Toggle[Any]] = {}


def _nesting_error(label: str) -> RuntimeError:
    return RuntimeError(
        f"toggleshim: nested toggle_optimizer blocks are not available on {label}: its toggle code is not "
        "one toggleshim has verified, so `with self.toggle_optimizer(opt):` runs Lightning's own sequence "
        "(toggle; zero_grad; body; step; untoggle), and Lightning's own nested toggles freeze the inner "
        "optimizer's parameters for good. Nothing was changed. Close the outer block first, or: run "
        "`python -m toggleshim check`, pin Lightning to a release toggleshim verified, and report this "
        "Lightning version to toggleshim."
    )


def make_fallback(original_toggle: Callable[..., Any], label: str) -> Callable[..., Toggle[Any]]:
    """A ``toggle_optimizer`` for a flavour whose toggle code is unverified: ``original_toggle`` (the
    flavour's own) makes the toggle, and the block closes with the module's own ``untoggle_optimizer``
    (the flavour's, or a subclass's override). ``label`` names the Lightning in messages
    ("lightning 2.7.0 (lightning.pytorch)")."""

    def toggle_optimizer(self: Any, optimizer: Any, **flags: Unpack[Flags]) -> Toggle[Any]:
        """Lightning's own ``toggle_optimizer`` (its code is not one toggleshim verified); the result is
        also a context manager running Lightning's own sequence: zero_grad on entry, step on a clean
        exit, Lightning's ``untoggle_optimizer`` on every exit. Nested blocks raise an error."""
        given = _flags_of(flags) if flags else _DEFAULTS
        if id(self) in _OPEN_BLOCKS:
            raise _nesting_error(label)
        # read before toggling: a failing strategy changes nothing
        sync = None if given["sync_grad"] else getattr(self.trainer.strategy, "block_backward_sync", None)
        original_toggle(self, optimizer)
        return _block(self, optimizer, given, sync, None, label)

    return toggle_optimizer


# -- the statement untoggle ---------------------------------------------------------------------


def _untoggled(module: Any, optimizer: Any) -> bool:
    """toggleshim's ``untoggle_optimizer(optimizer)``, before Lightning's: True when it undid a toggle
    of toggleshim's instead (then Lightning's untoggle must not run).

    * the exit of a block of this module calls the module's own ``untoggle_optimizer`` (a subclass's
      override), which reached this through ``super()``: that block's toggle is undone;
    * a statement toggle made inside a block: undone as a nested block;
    * otherwise Lightning's untoggle runs, and the last flat toggle's object lets go of everything.
    """
    state = _state_if_any(module)
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
            block = top.block() if top.block is not None else None
            surely(top.unwind)
            if block is not None:
                block._release()
            return True
        state.flat_record = 0  # Lightning's untoggle empties the record: no statement toggle is open
        return False
    ref, state.flat, state.flat_record = state.flat, None, 0
    flat = ref() if ref is not None else None
    if flat is not None and flat._phase == _MADE:  # untoggled as a statement: it holds nothing more
        flat._release()
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


keep_dynamo_out(globals())
