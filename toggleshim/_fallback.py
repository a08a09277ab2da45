"""The block on a Lightning whose toggle code toggleshim has not verified: Lightning's own sequence.

``_patch`` installs toggleshim's exact reimplementation only where ``toggle_optimizer`` and
``untoggle_optimizer`` are code it has verified (``_known.py``). On a flavour whose methods are
Lightning's own but whose code is new, it installs ``toggle_optimizer`` from :func:`make_fallback`
instead: that calls the ORIGINAL toggle and returns a :class:`FallbackToggle`, a small context manager
that runs exactly what a user would write by hand around it::

    self.toggle_optimizer(opt)        # that Lightning's own toggle, at the call (as in the shim)
    try:
        opt.zero_grad()               # on entering, if zero_grad
        ...                           # the block
        opt.step()                    # on a clean exit, if step
    finally:
        self.untoggle_optimizer(opt)  # the module's own untoggle (Lightning's, or an override), on every exit

So a statement keeps that Lightning's exact behaviour (its toggle runs, ``untoggle_optimizer`` stays the
original) and a block is, by construction, its manual sequence. The only thing that cannot be exact is
nesting (Lightning's own nested toggles freeze the inner optimizer's parameters for good): a toggle
while a fallback block of the same module is open raises a clear error before anything changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

from toggleshim._ours import FALLBACK_MARK, check_flags

__all__ = ["FallbackToggle", "make_fallback"]

_OptT = TypeVar("_OptT")
_MADE, _OPEN, _CLOSED = 0, 1, 2

# id(module) -> its open fallback block. The block holds the module while open, so the id cannot be
# reused meanwhile; every exit path removes the entry.
_OPEN_BLOCKS: dict[int, FallbackToggle[Any]] = {}


def _nesting_error(label: str) -> RuntimeError:
    return RuntimeError(
        f"toggleshim: nested toggle_optimizer blocks are not available on {label}: its toggle code is not "
        "one toggleshim has verified, so `with self.toggle_optimizer(opt):` runs Lightning's own sequence "
        "(toggle; zero_grad; body; step; untoggle), and Lightning's own nested toggles freeze the inner "
        "optimizer's parameters for good. Nothing was changed. Close the outer block first, or: run "
        "`python -m toggleshim check`, pin Lightning to a release toggleshim verified, and report this "
        "Lightning version to toggleshim."
    )


class FallbackToggle(Generic[_OptT]):
    """What ``toggle_optimizer`` returns on a Lightning whose toggle code toggleshim has not verified.

    The toggle has already happened (Lightning's own). As a statement, pair it with
    ``untoggle_optimizer`` as usual; as a block: ``zero_grad()`` on entry, ``step()`` on a clean exit,
    Lightning's own ``untoggle_optimizer`` on every exit; exceptions are never swallowed. Single-use.
    """

    __slots__ = ("_label", "_module", "_optimizer", "_phase", "_step", "_sync", "_untoggle", "_zero_grad")

    def __init__(
        self,
        module: Any,
        optimizer: _OptT,
        untoggle: Callable[[Any, Any], Any],
        label: str | None,
        zero_grad: bool,
        step: bool,
        sync: Any,
    ) -> None:
        self._module: Any = module
        self._optimizer: Any = optimizer
        self._untoggle: Callable[[Any, Any], Any] | None = untoggle
        self._label = label
        self._zero_grad = zero_grad
        self._step = step
        self._sync: Any = sync  # the strategy's block_backward_sync (sync_grad=False), entered with the block
        self._phase = _MADE

    def __enter__(self) -> _OptT:
        if self._phase != _MADE:
            raise RuntimeError(
                "this toggle was already used: a toggle object is single-use, write "
                "`with self.toggle_optimizer(opt):` for each block; nothing was changed"
            )
        module = self._module
        if self._label is not None:  # a fallback block: Lightning's own nested toggles are not exact
            if id(module) in _OPEN_BLOCKS:  # made as a statement inside a block, entered there
                raise _nesting_error(self._label)
            _OPEN_BLOCKS[id(module)] = self
        self._phase = _OPEN
        try:
            if self._sync is not None:
                context, self._sync = self._sync(), None  # left by _close only once entered:
                _, self._sync = context.__enter__(), context  # one line, no interrupt between the two
            if self._zero_grad:
                self._optimizer.zero_grad()
        except BaseException:
            self._close_quietly()  # no __exit__ will come: untoggle now
            raise
        return self._optimizer  # type: ignore[no-any-return]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if self._phase != _OPEN:
            raise RuntimeError("this toggle's block is not open")
        try:
            if exc_type is None and self._step:
                self._optimizer.step()
        except BaseException:
            self._close_quietly()
            raise
        if exc_type is None:
            self._close()
        else:
            self._close_quietly()  # the body's exception propagates unchanged
        return False  # never swallow

    def _close_quietly(self) -> None:
        """``_close`` while an error is in flight: that error propagates, not one of the untoggle's (an
        interrupt during the untoggle still does)."""
        with contextlib.suppress(Exception):
            self._close()

    def _close(self) -> None:
        """The module's own untoggle, then gradient sync resumed; lets go of everything."""
        module, optimizer, untoggle, sync = self._module, self._optimizer, self._untoggle, self._sync
        self._phase = _CLOSED
        self._module = self._optimizer = self._untoggle = self._sync = None
        if _OPEN_BLOCKS.get(id(module)) is self:
            del _OPEN_BLOCKS[id(module)]
        entered = sync is not None and hasattr(sync, "__exit__")  # not the function: the context it made
        try:
            assert untoggle is not None
            untoggle(module, optimizer)
        except BaseException:
            if entered:
                with contextlib.suppress(Exception):  # the untoggle's error propagates, not this one's
                    sync.__exit__(None, None, None)
            raise
        if entered:
            sync.__exit__(None, None, None)  # a clean exit: its own `finally` restores gradient sync

    def __repr__(self) -> str:
        status = ("toggled", "open", "closed")[self._phase]
        if self._label is None:
            return f"<toggleshim.Toggle {status} (the module's own toggle_optimizer)>"
        return f"<toggleshim fallback toggle {status} on {self._label}>"


def module_untoggle(module: Any, optimizer: Any) -> None:
    """``module.untoggle_optimizer(optimizer)``: the module's own method, a subclass's override included
    (on a flavour with the fallback, Lightning's own ``untoggle_optimizer`` stays in place)."""
    module.untoggle_optimizer(optimizer)


def make_fallback(original_toggle: Callable[..., Any], label: str) -> Callable[..., FallbackToggle[Any]]:
    """A ``toggle_optimizer`` for a flavour whose toggle code is unverified: ``original_toggle`` (the
    flavour's own), a :class:`FallbackToggle` closing with the module's own ``untoggle_optimizer`` (the
    flavour's, or a subclass's override). ``label`` names the Lightning in messages ("lightning 2.7.0
    (lightning.pytorch)")."""

    def toggle_optimizer(
        self: Any, optimizer: Any, zero_grad: bool = True, step: bool = True, sync_grad: bool = True
    ) -> FallbackToggle[Any]:
        """Lightning's own ``toggle_optimizer`` (its code is not one toggleshim verified); the result is
        also a context manager running Lightning's own sequence: zero_grad on entry, step on a clean
        exit, Lightning's ``untoggle_optimizer`` on every exit. Nested blocks raise an error."""
        check_flags(zero_grad=zero_grad, step=step, sync_grad=sync_grad)
        if id(self) in _OPEN_BLOCKS:
            raise _nesting_error(label)
        # read before toggling: a failing strategy changes nothing
        sync = None if sync_grad else getattr(self.trainer.strategy, "block_backward_sync", None)
        original_toggle(self, optimizer)
        return FallbackToggle(self, optimizer, module_untoggle, label, zero_grad, step, sync)

    setattr(toggle_optimizer, FALLBACK_MARK, label)
    return toggle_optimizer
