"""What is toggleshim's, and what is the user's: one rule each, by identity. No torch, nothing of toggleshim.

* **Ours**: a function toggleshim installed carries a weak reference to itself (``_toggleshim_self``)
  and the original it replaced. Only the object its own weak reference points at is ours:
  ``functools.wraps`` copies ``__dict__`` into someone else's wrapper (and wrapt's proxy forwards it).
* **The user's** (:func:`users`): whatever ``module.<name>`` resolves to that is not ours (an instance
  attribute, an override, a wrapper of Lightning's method whatever its ``__qualname__``, Lightning's own
  where toggleshim is not installed). The block calls it where the manual sequence would.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["MODE", "ORIGINAL", "SELF", "ToggleshimWarning", "describe", "mark", "original_of", "users"]

class ToggleshimWarning(UserWarning):
    """``install()`` left a Lightning flavour untouched, or gave it the fallback block (and why); a block
    steps a torch optimizer that Lightning does not count (``toggleshim.ToggleshimWarning``)."""


ToggleshimWarning.__module__ = "toggleshim"  # its public name (defined here: the block warns too)

ORIGINAL = "_toggleshim_original"  # on a method of ours: the function it replaced
SELF = "_toggleshim_self"  # on a method of ours: a weak reference to itself
MODE = "_toggleshim_mode"  # on our toggle_optimizer: "shim" (verified code) or "fallback"


def mark(fn: Callable[..., Any], original: Any, mode: str) -> None:
    """Make ``fn`` one of ours, replacing ``original``."""
    setattr(fn, ORIGINAL, original)
    setattr(fn, SELF, weakref.ref(fn))
    setattr(fn, MODE, mode)


def original_of(fn: Any) -> Any:
    """The original ``fn`` replaced when ``fn`` is one of toggleshim's methods, else None."""
    ref = getattr(fn, SELF, None)
    return getattr(fn, ORIGINAL, None) if isinstance(ref, weakref.ref) and ref() is fn else None


def users(module: Any, name: str) -> Callable[..., Any] | None:
    """``module.<name>`` when it is the user's, as the manual sequence would call it; None when it is
    toggleshim's. Never raises for a module without one."""
    own: Callable[..., Any] | None = getattr(module, "__dict__", {}).get(name)
    if own is not None:
        return own  # set on the instance
    if original_of(getattr(type(module), name, None)) is not None:
        return None
    found: Callable[..., Any] | None = getattr(module, name, None)
    return found


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
