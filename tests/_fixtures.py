"""Small fixture modules shared by the example tests (both Lightning flavours)."""

from __future__ import annotations

import importlib
import inspect
import os
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

# torch's marking of what dynamo must not trace: torch.compiler.disable from torch 2.1; on torch 2.0,
# torch._dynamo.disable, which takes no options (recursive= arrives in 2.1, reason= in 2.8)
DISABLE = "torch.compiler.disable" if hasattr(getattr(torch, "compiler", None), "disable") else "torch._dynamo.disable"
importlib.import_module("torch._dynamo")  # (torch 2.0 does not import it with torch)
disable: Any = eval(DISABLE, {"torch": torch})
DISABLE_TAKES_RECURSIVE = "recursive" in inspect.signature(disable).parameters
DISABLE_MARKS_RECURSIVE = hasattr(disable(lambda: None), "_torchdynamo_disable_recursive")  # from torch 2.2


def compile_refused() -> str | None:
    """What torch.compile says when it refuses this Python (torch 2.0 on Python 3.11), else None."""
    from toggleshim.testing.torchside import compile_refusal

    return compile_refusal()


def torch_properties_that_apply() -> int:
    """How many of ``check``'s torch properties pass here (the compile one is n/a where torch.compile
    refuses this Python)."""
    from toggleshim.testing.torchside import PROBES

    return len(PROBES) - (compile_refused() is not None)


def default_run() -> bool:
    """The default run (profile dev), kept within five minutes; ci, deep and mutants run every case."""
    return os.environ.get("HYPOTHESIS_PROFILE", "dev") == "dev"


def marked_flavours() -> list[str]:
    """The flavours a test marked ``one_flavour_by_default`` runs on: every installed one under the
    ci, deep and mutants profiles, the first alone in the default run (conftest.py)."""
    from toggleshim.testing import installed_flavours

    flavours = installed_flavours()
    return flavours[:1] if default_run() else flavours


def half_of(cases: list[Any], half: int) -> list[Any]:
    """Every case under the ci, deep and mutants profiles; in the default run, half of them: ``half``
    0 and 1 take complementary halves (a Latin square over a 2 x 2 list), so that two tests sharing
    the cases run each case once between them (conftest.py, "five minutes")."""
    if not default_run():
        return cases
    return [c for i, c in enumerate(cases) if (i + i // 2 + half) % 2 == 0]


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


def assert_a_block_toggles(flavour: str) -> None:
    """A block over the first head of :func:`three_heads` freezes the others; after it every parameter
    trains again (the shim is installed and works)."""
    module = three_heads(flavour)
    with module.toggle_optimizer(module.opts[0]):
        assert not module.b.weight.requires_grad
    assert all(state(module).values())
