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


def _reducers() -> dict[Any, Any]:
    """multiprocessing's table of reductions (``ForkingPickler.register`` writes there): the one record
    of which Trainer classes are handed over through toggleshim."""
    from multiprocessing.reduction import ForkingPickler

    return ForkingPickler._extra_reducers  # type: ignore[attr-defined,no-any-return]


def register(trainer_cls: type) -> None:
    """Hand ``trainer_cls`` (exactly that class: multiprocessing looks reductions up by type) to spawned
    processes through :func:`_reduce`. Idempotent."""
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(trainer_cls, _reduce)


def unregister() -> None:
    """Take every reduction of ours back (``uninstall()``)."""
    reducers = _reducers()
    for cls in [cls for cls, reduce in list(reducers.items()) if reduce is _reduce]:
        reducers.pop(cls, None)


def registered(trainer_cls: Any) -> bool:
    return _reducers().get(trainer_cls) is _reduce


def _reduce(trainer: Any) -> tuple[Any, ...]:
    """The Trainer's own reduction (what ``pickle`` makes of it), rebuilt by :func:`_rebuilt`."""
    rebuild, args, *rest = trainer.__reduce_ex__(4)
    return (_rebuilt, (rebuild, args), *rest)


def _rebuilt(rebuild: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """In the spawned process: toggleshim first (its import installs it on the Lightning loaded by
    now, and on any loaded later), then the Trainer, as ``pickle`` would rebuild it."""
    import toggleshim  # noqa: F401

    return rebuild(*args)
