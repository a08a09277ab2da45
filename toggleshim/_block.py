"""The block: ``with self.toggle_optimizer(opt, **flags):``, one class for every kind of toggle::

    toggle                             # at the call: one of the kinds of _toggle.py
    enter:  no-sync context (sync_grad=False); opt.zero_grad() (zero_grad)
    exit:   opt.step() (step, clean exit only); untoggle (always); no-sync context left (always)

The untoggle is the toggle's own (the user's ``untoggle_optimizer`` where the manual sequence would
call it, else toggleshim's exact undo): the block does not know which kind it holds. The flags are
declared once, in :class:`Flags` and :data:`FLAGS`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from types import FrameType, MethodType, TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypedDict, TypeVar, cast

from toggleshim import _toggle
from toggleshim._ours import ToggleshimWarning, describe, users
from toggleshim._toggle import _Made
from toggleshim._writes import first, quietly, surely

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11; mypy brings this one

__all__ = ["FLAGS", "Flags", "Toggle", "toggle"]

_OptT = TypeVar("_OptT")
_new = object.__new__  # a Toggle is made without calling Toggle.__new__ (which toggles)


# -- the flags ----------------------------------------------------------------------------------


class Flags(TypedDict, total=False):
    """The block's flags, keyword arguments of every entry point (exactly ``True`` or ``False``)."""

    zero_grad: bool
    step: bool
    sync_grad: bool


#: Each flag's default and what it does. A new flag is one entry here, one in :class:`Flags`, and what
#: the block does with it (``Toggle.__enter__`` / ``Toggle._exit``).
FLAGS: dict[str, tuple[bool, str]] = {
    "zero_grad": (True, "call ``optimizer.zero_grad()`` on entering the block."),
    "step": (True, "call ``optimizer.step()`` when the block ends without an exception."),
    "sync_grad": (True, "``False`` skips the DDP gradient all-reduce inside the block (gradient accumulation "
                  "micro-batches), restored on every exit."),
}
_DEFAULTS: dict[str, bool] = {name: default for name, (default, _) in FLAGS.items()}


def _checked(given: Mapping[str, Any]) -> dict[str, bool]:
    """``given``, each flag exactly a ``bool``; else ``TypeError`` naming it, before anything changes."""
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
    return dict(given)


def _flags_of(given: Mapping[str, Any]) -> dict[str, bool]:
    """Every flag's value: ``given`` (checked) over the defaults."""
    return {**_DEFAULTS, **_checked(given)}


def _no_sync(module: Any, flags: Mapping[str, bool]) -> Any:
    """The strategy's no-sync context factory where ``sync_grad=False``, read before anything changes."""
    return None if flags["sync_grad"] else getattr(module.trainer.strategy, "block_backward_sync", None)


# -- the block ----------------------------------------------------------------------------------

# A block's phase: toggled (not entered yet), open, leaving (the user's untoggle called or about to
# be: never twice), closed
_MADE, _OPEN, _LEFT, _CLOSED = range(4)


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

    __slots__ = ("__weakref__", "_flags", "_guard", "_inner_block", "_made", "_optimizer", "_phase", "_stepped",
                 "_sync_exit", "_watch")

    _flags: dict[str, bool]
    _guard: weakref.ref[Any] | None  # the __exit__ the with statement holds, watched (see _ExitGuard)
    _made: _Made | None  # the toggle under the block (None once closed)
    _optimizer: Any  # while the block is open: the optimizer it steps (its toggle may be undone first)
    _phase: int
    _stepped: bool | None  # the block's optimizer stepped while the block was open (_watch_steps); None: by its exit
    _inner_block: bool  # ... by a nested block's exit over the same optimizer (the double step's message)
    _sync_exit: list[Callable[..., Any]] | None  # the entered no-sync context's __exit__, until it is called
    _watch: MethodType | None  # while open with step=True: the step watch on the block's torch optimizer

    def __new__(cls, module: Any, optimizer: _OptT, *extra: Any, **flags: Unpack[Flags]) -> Toggle[_OptT]:
        if extra:
            raise _positional(extra, "Toggle()")
        return toggle(module, optimizer, **flags)

    # -- entering ---------------------------------------------------------------------------

    def __enter__(self) -> _OptT:
        made = self._check_enterable()
        flags = self._flags
        try:
            self.__class__ = _Open  # first: from here on, a block let go of is closed (_Open.__del__)
            self._phase, self._optimizer = _OPEN, made.optimizer  # from here on, leaving untoggles
            if flags["step"]:
                if made.optimizer is made.inner:  # a torch optimizer, not its LightningOptimizer (rare)
                    _warn_raw(made.module, made.inner)
                self._watch_steps(made.inner)
            looked_up = _local.__dict__.pop("exit", None)
            if looked_up is not None:
                _watch_class_exit(self, looked_up)
            # the toggle is the block's from here on (one made while a statement toggle was open nests
            # inside it: _Flat.nested); held first, so that leaving undoes what it opens
            self._made = made = made.for_block()
            made.open()
            if made.sync is not None:
                # Without gradient sync (DDP micro-batches) the block runs inside the strategy's
                # no_sync, entered here and left on every exit.
                made.sync = made.sync()
                # One line: no interrupt falls between entering the context and recording its exit
                _, self._sync_exit = made.sync.__enter__(), [made.sync.__exit__]
            if flags["zero_grad"]:
                self._optimizer.zero_grad()
            return self._optimizer  # type: ignore[no-any-return]
        except BaseException:
            quietly(self._leave, retry=False)  # the error in flight propagates (an interrupt too)
            raise

    def _check_enterable(self) -> _Made:
        made = self._made
        if self._phase != _MADE or made is None:
            raise RuntimeError(
                "this toggle was already used: a toggle object is single-use, write "
                "`with self.toggle_optimizer(opt):` for each block; nothing was changed"
            )
        if not made.enterable():  # (the fallback's toggle raises its own refusal to nest)
            raise RuntimeError(
                "this toggle was undone or superseded before its block started (untoggle_optimizer ran, or "
                "another toggle); enter it where it is made: `with self.toggle_optimizer(opt):`; nothing "
                "was changed"
            )
        return made

    def _watch_steps(self, inner: Any) -> None:
        """While the block is open, ``inner.step`` is a watch on this instance alone (over whatever
        ``step`` was there), taken off at the exit: a step inside a block that steps on exit is refused,
        not made twice. Not torch's step hooks: torch 2.0 and 2.1's dynamo strips them from every
        optimizer class at the first ``torch.compile`` in the process."""
        own = getattr(inner, "__dict__", None)
        if type(own) is not dict:  # (an optimizer-like object without instance attributes: not watched)
            return
        block = weakref.ref(self)
        taken = inner.step

        def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            stepped = taken(*args, **kwargs)
            toggle = block()  # a step that raised is no step (as for torch's post-step hooks)
            if toggle is not None and toggle._stepped is not None:  # (None: the block's own, at its exit)
                toggle._stepped = True
                toggle._inner_block = _stepped_by_a_block(toggle)  # (only where the exit will refuse)
            return stepped

        step.covers = own.get("step", _NOTHING)  # type: ignore[attr-defined]
        step.closed = False  # type: ignore[attr-defined]
        # a bound method, as torch's own LR schedulers expect ``optimizer.step`` to be
        self._watch = watch = MethodType(step, inner)
        inner.step = watch

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
                    raise _double_step(_toggle._unwrap(optimizer), self._inner_block)
                self._stepped = None  # the step the watch sees now is the block's own
                optimizer.step()
        except BaseException:
            quietly(self._leave, retry=False)  # step's error propagates, not one of the untoggle's
            raise
        if exc_type is None:
            self._leave()
        else:
            quietly(self._leave, retry=False)  # the body's exception propagates unchanged
        return False  # never swallow

    def _leave(self) -> None:
        """``finally: self.untoggle_optimizer(opt)``: the toggle's own exit (the user's method, called
        once), then toggleshim's part, retried until done."""
        error: BaseException | None = None
        if self._phase == _OPEN:
            self._phase = _LEFT  # first: an interrupt from here on never calls the module's own method twice
            made = self._made
            assert made is not None
            error = made.leave()
        try:
            surely(self._close)
        except BaseException as e:
            error = first(error, e)
        if error is not None:
            raise error

    def _close(self) -> None:
        """toggleshim's part of every exit, idempotent: the step watch off, the toggle undone (those
        open above it first), gradient sync resumed; then the block lets go of everything."""
        if self._watch is not None:
            _unwatch(self._watch)
        made = self._made
        error: BaseException | None = None
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
        self._made = self._optimizer = self._guard = self._watch = None
        self.__class__ = Toggle

    def _exit_dropped(self, ref: weakref.ref[Any]) -> None:
        # The with statement let go of its __exit__ while the block was open (Ctrl-C at its first line,
        # where nothing can catch it): closed now, without user code where the toggle has another undo
        _GUARDS.discard(ref)
        if self._guard is ref:
            self._abandoned()

    def _abandoned(self) -> None:
        made = self._made
        if self._phase not in (_OPEN, _LEFT) or made is None:
            return
        try:
            if self._phase == _OPEN:
                self._phase = _LEFT
                made.abandon()
        finally:
            self._close()

    def __repr__(self) -> str:
        made = self._made
        if made is None or made.done:
            return f"<toggleshim.Toggle {'closed' if self._phase == _CLOSED else 'untoggled'} (holds nothing)>"
        return made.describe(("toggled", "open", "closing")[self._phase])


class _Open(Toggle[Any]):
    """The class of a :class:`Toggle` while its block is open (``__enter__`` to the end of its exit), so
    that only a block let go of while open is finalized, never one closed as usual (a ``__del__`` on
    ``Toggle`` itself would run at every block's end, and an interrupt landing in it would be lost).

    Let go of while open, no ``__exit__`` can come any more: an explicit ``t.__exit__(...)`` interrupted
    at its first line or in torch's wrapper around it, where nothing can catch it (the block closes as
    the interrupt's traceback lets go of it), or never called. (The ``__exit__`` a with statement or
    an ``ExitStack`` holds is watched: closed as that is let go of, see :class:`_ExitGuard`.)
    """

    __slots__ = ()

    def __del__(self) -> None:
        self._abandoned()


_NOTHING: Any = object()  # the step watch covered no ``step`` of the instance's own


def _unwatch(watch: MethodType) -> None:
    """Take a step watch off its optimizer (idempotent): the ``step`` it covered is the instance's again,
    past the watches of blocks closed meanwhile. A watch someone else's wrapper covers in turn stays,
    passing steps through."""
    watch.__func__.closed = True  # type: ignore[attr-defined]
    own = vars(watch.__self__)
    if own.get("step") is watch:
        covered: Any = watch.__func__.covers
        while isinstance(covered, MethodType) and getattr(covered.__func__, "closed", False):
            covered = covered.__func__.covers  # type: ignore[attr-defined]
        if covered is _NOTHING:
            own.pop("step", None)
        else:
            own["step"] = covered


def _double_step(inner: Any, by_a_block: bool) -> RuntimeError:
    if by_a_block:
        return RuntimeError(
            f"toggleshim: a nested `with self.toggle_optimizer(opt):` over the same {type(inner).__name__} stepped it "
            "on its exit, inside this block over it, which steps on a clean exit too (step=True): the optimizer "
            "would step twice. Pass step=False to one of the two blocks (the inner one, to step once at the "
            "outer's exit). The outer block did not step again; it untoggled."
        )
    return RuntimeError(
        f"toggleshim: {type(inner).__name__}.step() ran inside `with self.toggle_optimizer(opt):` (directly or "
        "through the LightningOptimizer), which steps on a clean exit too (step=True): the optimizer would step "
        "twice. Pass step=False to keep your own step() call, or drop the call and let the block step. The "
        "block did not step again; it untoggled."
    )


def _stepped_by_a_block(block: Toggle[Any]) -> bool:
    """The step ``block``'s watch saw is another block's exit over the same optimizer (a nested block), not
    a ``step()`` the body wrote: found on the stack (the error's path only)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(64):  # the step's own frames (torch's wrappers, Lightning's) lie between; a bound
        if frame is None:
            return False
        other = frame.f_locals.get("self") if frame.f_code is _EXIT_CODE else None
        if isinstance(other, Toggle) and other is not block:
            return True
        frame = frame.f_back
    return False


_EXIT_CODE = Toggle._exit.__code__  # (torch.compiler.disable wraps the method later: _patch._keep_dynamo_out)

# Per thread: the Toggle.__exit__ last looked up on the class ("exit", see _ExitGuard), the calls of a
# user's toggle_optimizer under toggle() ("catches"), the names the import hook is finding ("finding").
_local = threading.local()

# The torch optimizers a block stepped directly under Trainer.fit, warned about once each (weakly held:
# an optimizer is freed as without toggleshim). Only added to; a race warns twice at most.
_RAW_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()


def _warn_raw(module: Any, inner: Any) -> None:
    """A block that steps a torch optimizer, not the ``LightningOptimizer`` wrapping it, inside
    ``Trainer.fit``: Lightning counts no step, so ``global_step`` stays 0 and ``max_steps`` never ends.
    Warned once per optimizer, at the user's ``with`` line; outside ``fit`` (a stand-in trainer, a
    module attached by hand) nothing is counted anyway."""
    try:
        if getattr(module.trainer, "training", False) is not True or inner in _RAW_WARNED:
            return
        _RAW_WARNED.add(inner)
    except Exception:  # no trainer to ask (nothing counts steps), or an optimizer a WeakSet cannot hold
        return
    frame: FrameType | None = sys._getframe(1)
    level = 2  # frames: this function, __enter__, the with statement
    while frame is not None and (frame.f_code.co_filename == __file__ or _DYNAMO in frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(ToggleshimWarning(
        f"toggleshim: this block steps a {type(inner).__name__} directly, not through its LightningOptimizer, "
        "so Lightning does not count its steps: trainer.global_step stays where it is (0 if every step is so), "
        "Trainer(max_steps=...) never ends, and the precision plugin's and strategy's step hooks do not run. "
        "Pass the LightningOptimizer that self.optimizers() returns (not self.optimizers(use_pl_optimizer=False) "
        "or an optimizer of your own); Lightning's own statements count nothing for it either. (Said once per "
        "optimizer.)"), stacklevel=level)


_DYNAMO = "_dynamo"  # torch.compiler.disable's wrapper frames between the with statement and __enter__


class _ExitGuard:
    """``Toggle.__exit__``: ``Toggle._exit``, watched while its block is open.

    A Ctrl-C can land before the first line of any ``__exit__``, where no ``try`` can catch it. So the
    ``__exit__`` handed to a ``with`` statement is a fresh bound method, watched through a weak
    reference: when the statement lets go of it with the block still open, the block is closed
    (``Toggle._exit_dropped``). Only the last lookup before the block opens is watched.
    """

    def __get__(self, toggle: Toggle[Any] | None, cls: Any = None) -> Any:
        if toggle is None:
            # Toggle.__exit__ (ExitStack.enter_context looks it up so, before __enter__, and keeps it):
            # a fresh function, which the next __enter__ in this thread watches if it is still held
            def __exit__(
                toggle: Toggle[Any], exc_type: type[BaseException] | None, exc: BaseException | None,
                tb: TracebackType | None,
            ) -> Literal[False]:
                return toggle._exit(exc_type, exc, tb)

            _local.exit = weakref.ref(__exit__)
            return __exit__
        exit_fn = MethodType(Toggle._exit, toggle)
        if toggle._phase == _MADE and toggle._made is not None:  # the with statement, about to enter
            _guard(toggle, exit_fn)
        return exit_fn


def _watch_class_exit(toggle: Toggle[Any], ref: weakref.ref[Any]) -> None:
    """Watch the ``Toggle.__exit__`` looked up just before in this thread (``ExitStack``), if still held
    and the with statement handed ``toggle`` no ``__exit__`` of its own."""
    exit_fn = ref()
    if exit_fn is not None and toggle._guard is None:
        _guard(toggle, exit_fn)


# The watches of the open blocks' __exit__, held here too: a weak reference's callback runs only if the
# reference outlives what it watches, and where exit, block and watch are garbage together (a
# traceback's cycle) the block would be freed unclosed. It holds nothing longer than the exit lives.
# Only added to and discarded from (each watch a distinct object): right under any interleaving.
_GUARDS: set[weakref.ref[Any]] = set()


def _guard(toggle: Toggle[Any], exit_fn: Any) -> None:
    watch = weakref.ref(exit_fn, toggle._exit_dropped)
    _GUARDS.add(watch)  # first: a watch not yet the block's only discards itself (_exit_dropped)
    toggle._guard = watch


if not TYPE_CHECKING:
    Toggle.__exit__ = _ExitGuard()


# -- making a block -----------------------------------------------------------------------------


def _block(made: _Made, flags: dict[str, bool], sync: Any) -> Toggle[Any]:
    t: Toggle[Any] = _new(Toggle)
    t._made, t._flags, t._phase, t._stepped, t._inner_block = made, flags, _MADE, False, False
    t._optimizer = t._sync_exit = t._guard = t._watch = None
    made.sync = sync
    catches = _local.__dict__.get("catches")
    if catches:  # a user's toggle_optimizer under toggle(): this block is what its super() made
        for ref in reversed(catches):
            catch = ref()
            if catch is not None and catch.module is made.module:
                catch.made = t
                break
    return t


def _positional(extra: tuple[Any, ...], name: str = "toggle_optimizer()") -> TypeError:
    """A positional argument after the optimizer: the flags are keywords, and Lightning 2 has no
    optimizer index (Lightning 1.x's second argument)."""
    return TypeError(
        f"{name} takes the optimizer as its only positional argument, got {len(extra)} more "
        f"({', '.join(map(describe, extra))}): the block's flags are keywords "
        f"({', '.join(f'{n}=' for n in FLAGS)}), and Lightning 2 has no optimizer index (Lightning 1.x's "
        "toggle_optimizer(optimizer, optimizer_idx)); nothing was changed"
    )


def _toggle_optimizer(self: Any, optimizer: _OptT, *extra: Any, **flags: Unpack[Flags]) -> Toggle[_OptT]:
    """The toggle; ``_patch`` installs copies of this very function as ``toggle_optimizer``."""
    if extra:
        raise _positional(extra)
    given = _flags_of(flags) if flags else _DEFAULTS
    trainer = self.trainer  # Lightning's own RuntimeError when not attached to a Trainer
    sync = None if given["sync_grad"] else getattr(trainer.strategy, "block_backward_sync", None)
    return _block(_toggle.toggle(self, optimizer, trainer.optimizers), given, sync)


def make_fallback(original_toggle: Callable[..., Any], label: str) -> Callable[..., Toggle[Any]]:
    """The ``toggle_optimizer`` of a flavour with unverified toggle code: ``original_toggle`` toggles,
    the block closes with the module's own ``untoggle_optimizer``. ``label`` names the Lightning."""

    def toggle_optimizer(self: Any, optimizer: Any, *extra: Any, **flags: Unpack[Flags]) -> Toggle[Any]:
        """Lightning's own ``toggle_optimizer`` (its code is not one toggleshim verified); the result is
        also a context manager running Lightning's own sequence: zero_grad on entry, step on a clean
        exit, Lightning's ``untoggle_optimizer`` on every exit. Nested blocks raise an error."""
        if extra:
            raise _positional(extra)
        given = _flags_of(flags) if flags else _DEFAULTS
        _toggle.refuse_nesting(self, label)
        sync = _no_sync(self, given)
        original_toggle(self, optimizer)
        return _block(_toggle.own(self, optimizer, label), given, sync)

    return toggle_optimizer


def toggle(module: Any, optimizer: _OptT, *extra: Any, **flags: Unpack[Flags]) -> Toggle[_OptT]:
    """Typed entry point: ``with toggleshim.toggle(self, opt):`` is ``with self.toggle_optimizer(opt):``.

    Static checkers read Lightning's ``toggle_optimizer(...) -> None`` and reject it in a ``with``;
    this function has the precise type. Where ``self.toggle_optimizer`` is the user's (an override,
    a method set on the instance, a wrapper; Lightning's own where toggleshim is not installed), it
    makes the toggle: see :func:`_through_users`. On a Lightning whose toggle code toggleshim has not
    verified it is that Lightning's own sequence, as the patched method is there (docs/guard.md).
    """
    if extra:
        raise _positional(extra, "toggleshim.toggle()")
    fn = getattr(type(module), "toggle_optimizer", None)
    if not callable(fn):
        raise TypeError(
            f"toggleshim.toggle() expects a LightningModule as its first argument, got {describe(module)}; "
            "nothing was changed"
        )
    theirs = users(module, "toggle_optimizer")
    if theirs is not None:
        return _through_users(module, optimizer, theirs, flags)
    return cast("Toggle[_OptT]", fn(module, optimizer, **flags))  # toggleshim's: the shim's, or the fallback's


class _Catch:
    """The block a user's ``toggle_optimizer`` makes through its ``super()`` under ``toggle()``."""

    __slots__ = ("__weakref__", "made", "module")

    made: Toggle[Any] | None

    def __init__(self, module: Any) -> None:
        self.module, self.made = module, None


def _through_users(
    module: Any, optimizer: _OptT, theirs: Callable[..., Any], flags: Mapping[str, Any]
) -> Toggle[_OptT]:
    """``toggle()`` where ``self.toggle_optimizer`` is the user's, called with the optimizer alone. The
    block its ``super().toggle_optimizer(opt, ...)`` made is the block, returned or not, with that call's
    flags; flags given to ``toggle()`` win. A method that makes none gets the manual sequence around
    its toggle (zero_grad, the body, step, ``self.untoggle_optimizer(opt)``)."""
    explicit = _checked(flags)
    # read before the toggle: a failing strategy changes nothing
    sync = _no_sync(module, {**_DEFAULTS, **explicit})
    catch = _Catch(module)
    ref = weakref.ref(catch)
    catches: list[weakref.ref[_Catch]] = _local.__dict__.setdefault("catches", [])
    try:
        catches.append(ref)
        made = theirs(optimizer)
    finally:
        catches[:] = [r for r in catches if r is not ref and r() is not None]
    caught = catch.made
    if made is None and caught is not None and caught._phase == _MADE and caught._made is not None:
        made = caught  # the return forgotten
    block: Toggle[_OptT]
    if (isinstance(made, Toggle) and made._phase == _MADE and made._made is not None
            and made._made.enterable() and made._made.module is module and made._made.optimizer is optimizer):
        block = made
        block._flags = {**block._flags, **explicit}
        if "sync_grad" in explicit:
            block._made.sync = sync  # type: ignore[union-attr]
        return block
    return _block(_toggle.own(module, optimizer), {**_DEFAULTS, **explicit}, sync)
