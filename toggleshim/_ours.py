"""What is toggleshim's, and the pieces every other module shares. Imports no torch; of toggleshim, the registry.

* **One rule for "ours"**: a function toggleshim installed carries a weak reference to itself
  (``_toggleshim_self``) and the original it replaced (``_toggleshim_original``). Only the object its
  own weak reference points at is ours: ``functools.wraps`` copies ``__dict__``, so someone else's
  wrapper over ours carries copies of both marks (and a proxy such as wrapt's forwards them).
* **Which methods a module's class really runs** (:func:`overrides`): the block keeps the
  extension points of what it replaces, so where a subclass overrides ``toggle_optimizer`` or
  ``untoggle_optimizer`` the block calls the module's own method.
* The description of a bad value, for every error message.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from toggleshim._flavours import FLAVOURS

__all__ = [
    "MODE",
    "ORIGINAL",
    "SELF",
    "describe",
    "is_lightnings",
    "mark",
    "original_of",
    "overrides",
    "route",
]

ORIGINAL = "_toggleshim_original"  # on a method of ours: the function it replaced
SELF = "_toggleshim_self"  # on a method of ours: a weak reference to itself
MODE = "_toggleshim_mode"  # on our toggle_optimizer: "shim" (verified code) or "fallback"

#: Where each flavour defines ``LightningModule``: its own methods live there.
CORE_MODULES = tuple(f.core_module for f in FLAVOURS)


def mark(fn: Callable[..., Any], original: Any, mode: str) -> None:
    """Make ``fn`` one of ours, replacing ``original``."""
    setattr(fn, ORIGINAL, original)
    setattr(fn, SELF, weakref.ref(fn))
    setattr(fn, MODE, mode)


def original_of(fn: Any) -> Any:
    """The original ``fn`` replaced when ``fn`` is one of toggleshim's methods, else None."""
    ref = getattr(fn, SELF, None)
    return getattr(fn, ORIGINAL, None) if isinstance(ref, weakref.ref) and ref() is fn else None


def is_lightnings(fn: Any, name: str) -> bool:
    """``fn`` is a flavour's own ``LightningModule.<name>`` (also under ``torch.compiler.disable``,
    whose wrapper copies the name), or toggleshim's replacement of it."""
    if original_of(fn) is not None:
        return True
    return getattr(fn, "__qualname__", None) == f"LightningModule.{name}" and getattr(fn, "__module__", None) in (
        CORE_MODULES
    )


def overrides(module: Any, name: str) -> bool:
    """Whether ``module``'s class runs its own ``name`` (``toggle_optimizer`` or ``untoggle_optimizer``:
    a subclass's override, or someone else's patch) rather than Lightning's or toggleshim's."""
    return not is_lightnings(getattr(type(module), name, None), name)


def route(module: Any) -> Callable[..., Any] | None:
    """The fallback ``toggle_optimizer`` installed on ``module``'s Lightning flavour, if that flavour's
    toggle code is unverified, else None (then the shim's own toggle is exact there). A subclass's
    own ``toggle_optimizer`` is skipped: the first of toggleshim's methods up the class's MRO (the
    flavour's ``LightningModule``) decides, by the mode it was installed with."""
    for cls in type(module).__mro__:
        fn = vars(cls).get("toggle_optimizer")
        if original_of(fn) is not None:
            return fn if getattr(fn, MODE, None) == "fallback" else None
    return None


def describe(obj: Any) -> str:
    """``module.Class (repr)`` for an error message; never raises (a broken ``__repr__`` is bad input too)."""
    cls = type(obj)
    try:
        text = repr(obj)
    except Exception:
        text = "<repr failed>"
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{cls.__module__}.{cls.__qualname__} ({text})"
