"""Spawned processes inherit toggleshim: a Trainer handed to a spawned rank imports toggleshim first.

``strategy="ddp_spawn"`` starts each rank with multiprocessing's ``spawn``: a fresh interpreter that
runs only the top level of the main script, then unpickles what the parent sent it (the Trainer, the
model in it). An ``import toggleshim`` inside ``main()``, or in a package's ``__main__.py``, never
runs there. So, once a flavour's ``Trainer`` exists in a process where toggleshim is installed,
toggleshim registers a reduction of that class with multiprocessing's own pickler
(``ForkingPickler``, which only hands objects to child processes: ``pickle``, ``torch.save`` and
``copy.deepcopy`` are untouched): the Trainer pickles as it always does, wrapped in a call that
imports toggleshim in the child before the Trainer is rebuilt, so that the rank's Lightning is
patched before it trains. Imports nothing at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register", "registered", "unregister"]

_REGISTERED: set[type] = set()  # the Trainer classes whose reduction is ours


def register(trainer_cls: type) -> None:
    """Hand ``trainer_cls`` (exactly that class: multiprocessing looks reductions up by type) to spawned
    processes through :func:`_reduce`. Idempotent."""
    if trainer_cls in _REGISTERED:
        return
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(trainer_cls, _reduce)
    _REGISTERED.add(trainer_cls)


def unregister() -> None:
    """Take every reduction of ours back (``uninstall()``)."""
    from multiprocessing.reduction import ForkingPickler

    reducers = getattr(ForkingPickler, "_extra_reducers", {})
    for cls in list(_REGISTERED):
        if reducers.get(cls) is _reduce:
            del reducers[cls]
        _REGISTERED.discard(cls)


def registered(trainer_cls: Any) -> bool:
    return trainer_cls in _REGISTERED


def _reduce(trainer: Any) -> tuple[Any, ...]:
    """The Trainer's own reduction (what ``pickle`` makes of it), rebuilt by :func:`_rebuilt`."""
    rebuild, args, *rest = trainer.__reduce_ex__(4)
    return (_rebuilt, (rebuild, args), *rest)


def _rebuilt(rebuild: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """In the spawned process: toggleshim first (its import installs it on the Lightning loaded by
    now, and on any loaded later), then the Trainer, as ``pickle`` would rebuild it."""
    import toggleshim  # noqa: F401

    return rebuild(*args)
