"""Small fixture modules shared by the example tests (both Lightning flavours)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch import nn

import toggleshim
from toggleshim import _toggle


def pl(flavour: str) -> Any:
    return importlib.import_module(flavour)


def three_heads(flavour: str, n_opt: int = 2, frozen: bool = False, shared: bool = False) -> Any:
    """A module with heads a, b, c (Linear 2->2), one optimizer per head, optionally a frozen
    parameter and a parameter shared by the first two optimizers; attached to a stand-in trainer."""
    base = pl(flavour).LightningModule

    class Heads(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            gen = torch.Generator().manual_seed(0)
            self.a, self.b, self.c = (nn.Linear(2, 2) for _ in range(3))
            self.free = nn.Parameter(torch.ones(1))  # in no optimizer
            with torch.no_grad():
                for p in self.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen))
            if frozen:
                self.a.bias.requires_grad_(False)

    module = Heads()
    heads = [module.a, module.b, module.c][:n_opt]
    groups = [list(h.parameters()) for h in heads]
    if shared:
        groups[1].append(module.a.weight)
    optimizers = [torch.optim.SGD(g, lr=0.1, momentum=0.9) for g in groups]
    module._trainer = SimpleNamespace(optimizers=optimizers, strategy=SimpleNamespace())
    module.opts = optimizers
    return module


def state(module: Any) -> dict[str, bool]:
    return {n: p.requires_grad for n, p in module.named_parameters()}


# -- hostile parts shared by tests/test_robustness.py and property_tests/test_hostile.py ---------

PACKAGE = str(Path(toggleshim.__file__).parent)
HARNESS = str(Path(PACKAGE) / "testing")
# Not the toggle's lines: run by the garbage collector or the import system at any time (toggleshim's
# import hook; the weak reference callback of a module's state, a lambda in _state: a module dying).
ASYNCHRONOUS = {"_drop_caches", "_forget", "find_spec"}
ASYNCHRONOUS_CODE = {c for c in _toggle._state.__code__.co_consts if hasattr(c, "co_code")}


class Interrupter:
    """Raises ``KeyboardInterrupt`` at the ``k``-th line the package executes (the harness excluded),
    as a SIGINT handler would between two lines (``k=0``: only counts the lines). Python unsets a
    trace function that raises, so there is exactly one interrupt."""

    def __init__(self, k: int = 0) -> None:
        self.k, self.lines = k, 0
        self.raised: KeyboardInterrupt | None = None
        self.where = ""

    def __enter__(self) -> Interrupter:
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)

    def _call(self, frame: Any, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if (
            frame.f_code.co_name in ASYNCHRONOUS
            or frame.f_code in ASYNCHRONOUS_CODE
            or not name.startswith(PACKAGE)
            or name.startswith(HARNESS)
        ):
            return None
        return self._line

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
            if self.lines == self.k:
                self.where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} ({frame.f_code.co_name})"
                self.raised = KeyboardInterrupt(self.where)
                raise self.raised
        return self._line


class Refusing(nn.Parameter):
    """A parameter whose ``requires_grad`` setter refuses one value (subclasses and hooks can)."""

    refuse: bool | None = None
    errors: ClassVar[list[BaseException]] = []

    @property  # type: ignore[override]
    def requires_grad(self) -> bool:
        return torch._C.TensorBase.requires_grad.__get__(self)  # type: ignore[attr-defined,no-any-return]

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value is self.refuse:
            error = RuntimeError(f"refused requires_grad={value}")
            Refusing.errors.append(error)
            raise error
        torch._C.TensorBase.requires_grad.__set__(self, value)  # type: ignore[attr-defined]
