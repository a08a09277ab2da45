"""The ``requires_grad`` transaction: every write toggleshim makes to ``requires_grad`` and to the
module's record (:func:`apply`: a toggle; :func:`restore`: an untoggle), its cleanups (:func:`surely`,
:func:`quietly`), and the one rule for what propagates. Imports nothing of torch or of toggleshim.

**The rule** (:func:`first`). The first *error* (an ``Exception``) propagates, the very object, and
later errors are dropped; an *interrupt* (any other ``BaseException``) is never dropped and propagates
ahead of errors. **Interrupts at any line**: a Ctrl-C can land between any two lines, even before a
function's first line, where no ``try`` of its own catches it; so each cleanup step is idempotent,
marks itself done only once done, and :func:`surely` runs it once more when anything interrupts it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["MISSING", "RECORD", "apply", "first", "put_record", "quietly", "restore", "surely"]

RECORD = "_param_requires_grad_state"  # Lightning's name for the record, on the module
MISSING: Any = object()  # no record on the module


def first(error: BaseException | None, new: BaseException) -> BaseException:
    """Which of two exceptions propagates (the rule)."""
    if error is None or (isinstance(error, Exception) and not isinstance(new, Exception)):
        return new
    return error


def restore(params: Iterable[Any], values: Iterable[bool]) -> None:
    """``p.requires_grad = v`` for every pair; a failing write does not stop the others (an untoggle)."""
    error: BaseException | None = None
    for p, v in zip(params, values):
        try:
            p.requires_grad = v
        except BaseException as e:  # re-raised below, after the other writes
            error = first(error, e)
    if error is not None:
        raise error


def put_record(module: Any, record: Any) -> None:
    """``record`` becomes the module's record (:data:`MISSING`: none)."""
    if record is MISSING:
        module.__dict__.pop(RECORD, None)
    else:
        module.__dict__[RECORD] = record


def apply(
    module: Any,
    params: Sequence[Any],
    values: Iterable[bool],
    olds: Iterable[bool],
    record: Any,
    previous: Any,
    stack: list[Any] | None = None,
    entry: Any = None,
) -> None:
    """A toggle's writes, all or nothing: ``params`` get ``values``, ``record`` becomes the record and,
    last, ``entry`` goes on ``stack`` (the toggle is open from there on). On any failure before that,
    ``params`` get ``olds`` back and the record ``previous``. The record goes in ``__dict__``, as
    ``nn.Module.__setattr__`` would store a dict, without its cost (ten times a plain store)."""
    try:
        for p, v in zip(params, values):  # stops at a failing write: the rollback puts every one back
            p.requires_grad = v
        module.__dict__[RECORD] = record
        if stack is not None:
            stack.append(entry)
    except BaseException:
        quietly(_rollback, module, params, olds, previous)
        raise


def _rollback(module: Any, params: Sequence[Any], olds: Iterable[bool], previous: Any) -> None:
    try:
        restore(params, olds)
    finally:  # a parameter refusing its old value back never keeps the new record
        put_record(module, previous)


def surely(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` (idempotent), run once more if anything interrupts it, so that it completes before
    the first error propagates."""
    try:
        fn(*args)
    except BaseException:
        with contextlib.suppress(Exception):
            fn(*args)
        raise


def quietly(fn: Callable[..., None], *args: Any, retry: bool = True) -> None:
    """``surely(fn, *args)`` (``retry=False``: ``fn(*args)``, a cleanup that calls the user's code once)
    while an error is in flight: the cleanup's own errors are dropped, so that one propagates unchanged."""
    with contextlib.suppress(Exception):
        surely(fn, *args) if retry else fn(*args)
