"""Hostile parts shared by tests/test_robustness.py and property_tests/test_hostile.py: a tracer that
raises Ctrl-C at a chosen line of the package, a parameter whose ``requires_grad`` setter refuses.
(Apart from _fixtures.py, which must not import toggleshim: some tests import it before the patch.)"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

import toggleshim
from toggleshim import _block, _toggle

PACKAGE = str(Path(toggleshim.__file__).parent)
HARNESS = str(Path(PACKAGE) / "testing")
# Not the toggle's lines: run by the import system or the interpreter at any time (toggleshim's import
# hook and what it asks, at every import; the weak reference callbacks of a module's
# state, a lambda in _state: a module dying, and of its cached layout: a parameter dying).
ASYNCHRONOUS = {"_forget", "find_spec", "_unjudged", "_find_behind", "_is_hook", "_stale"}
ASYNCHRONOUS_CODE = {c for c in _toggle._state.__code__.co_consts if hasattr(c, "co_code")}


def _wrapper_codes() -> set[Any]:
    """The code of torch's ``torch.compiler.disable`` wrapper around the block's entry points (none on a
    torch without one): an interrupt lands in its lines too, before toggleshim's function starts."""
    fns = [vars(_block.Toggle)["_exit"], vars(_block.Toggle)["__enter__"]]
    return {fn.__code__ for fn in fns if inspect.unwrap(fn) is not fn}


def _wraps_ours(frame: Any) -> bool:
    wrapped = frame.f_locals.get("fn")
    return getattr(wrapped, "__module__", "").startswith("toggleshim.")


class Interrupter:
    """Raises ``KeyboardInterrupt`` at the ``k``-th line the package executes (the harness excluded),
    or at the first run of the line ``site``, as a SIGINT handler would between two lines (``k=0``
    and no site: only counts the lines, and lists them). Python unsets a
    trace function that raises, so there is exactly one interrupt."""

    def __init__(self, k: int = 0, site: tuple[str, int] | None = None) -> None:
        self.k, self.lines, self.site = k, 0, site  # site: at the first run of this (file, line) instead
        self.raised: KeyboardInterrupt | None = None
        self.where = ""
        self.sites: list[tuple[str, int]] = []  # counting (k=0): the line each count is, (file, number)
        # counting: the first line of each call of the package's functions (where no try of the
        # function's own can catch an interrupt), in the order run
        self.entries: list[tuple[str, int]] = []
        self.names: dict[tuple[str, int], str] = {}  # the function each entry is the first line of
        self._calling: Any = None  # the frame just called: its next line is its first

    def __enter__(self) -> Interrupter:
        self.wrappers = _wrapper_codes()
        # A stale class-level lookup of Toggle.__exit__ (pydoc, inspect: see _block._ExitGuard) would
        # run a few lines more in the next __enter__ only: every run starts without one
        _block._local.__dict__.pop("exit", None)
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        self._calling = None

    def _call(self, frame: Any, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if frame.f_code in self.wrappers and _wraps_ours(frame):  # torch's wrapper around an entry point
            self._calling = frame
            return self._line
        if (
            frame.f_code.co_name in ASYNCHRONOUS
            or frame.f_code in ASYNCHRONOUS_CODE
            or not name.startswith(PACKAGE)
            or name.startswith(HARNESS)
        ):
            return None
        self._calling = frame
        return self._line

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
            # the (file, line) pair only where it is needed: not when interrupting at the k-th line
            if self.lines == self.k or (
                self.site is not None and (frame.f_code.co_filename, frame.f_lineno) == self.site
            ):
                self.where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} ({frame.f_code.co_name})"
                self.raised = KeyboardInterrupt(self.where)
                raise self.raised
            if not self.k and self.site is None:
                self.sites.append((frame.f_code.co_filename, frame.f_lineno))
                if frame is self._calling:
                    self.entries.append(self.sites[-1])
                    self.names[self.sites[-1]] = frame.f_code.co_name
            self._calling = None
        return self._line


class AtFirstLine(Interrupter):
    """Raises ``KeyboardInterrupt`` once, at the first line run of any of ``codes`` (code objects:
    ``Toggle._exit.__code__``, the class-level ``__exit__``...), where no ``try`` of the function's
    own can catch it."""

    def __init__(self, *codes: Any) -> None:
        super().__init__()
        self.codes = codes

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_code in self.codes and self.raised is None:
            self.where = f"line {frame.f_lineno} of {frame.f_code.co_name}"
            self.raised = KeyboardInterrupt(self.where)
            raise self.raised
        return self._line


# the C base of every tensor: torch._C.TensorBase from torch 2.3, torch._C._TensorBase before
_TENSOR_BASE: Any = getattr(torch._C, "TensorBase", None) or torch._C._TensorBase  # type: ignore[attr-defined]


class Refusing(nn.Parameter):
    """A parameter whose ``requires_grad`` setter refuses one value (subclasses and hooks can)."""

    refuse: bool | None = None
    errors: ClassVar[list[BaseException]] = []

    @property  # type: ignore[override]
    def requires_grad(self) -> bool:
        return _TENSOR_BASE.requires_grad.__get__(self)  # type: ignore[no-any-return]

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value is self.refuse:
            error = self.refusal(value)
            Refusing.errors.append(error)
            raise error
        _TENSOR_BASE.requires_grad.__set__(self, value)

    def refusal(self, value: bool) -> BaseException:
        """What a refused write raises (a subclass may raise something else)."""
        return RuntimeError(f"refused requires_grad={value}")
