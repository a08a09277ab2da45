"""Spawned processes inherit toggleshim: a Trainer handed to a spawned rank imports toggleshim first.

``ddp_spawn`` starts each rank in a fresh interpreter that runs only the main script's top level, then
unpickles the Trainer: an ``import toggleshim`` inside ``main()`` never runs there. So each flavour's
``Trainer`` class gets a reduction in multiprocessing's own ``ForkingPickler`` (``pickle``,
``torch.save``, ``copy.deepcopy`` untouched) that imports toggleshim in the child before the Trainer is
rebuilt. Imports nothing at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register", "registered", "unregister"]


def _reducers() -> dict[Any, Any]:
    """multiprocessing's table of reductions: the one record of the Trainer classes handed over."""
    from multiprocessing.reduction import ForkingPickler

    return ForkingPickler._extra_reducers  # type: ignore[attr-defined,no-any-return]


def register(trainer_cls: type) -> None:
    """Hand exactly ``trainer_cls`` (reductions are looked up by type) to spawned processes. Idempotent."""
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
    """In the child: toggleshim first (installed on the Lightning loaded by now and any later), then the Trainer."""
    import toggleshim  # noqa: F401

    return rebuild(*args)
