"""Run a ``training_step`` body as written and as ``toggleshim migrate`` rewrites it; compare bitwise.

The module source is rendered from a body (statement style), executed from a string, and trained
either in a real ``Trainer.fit`` (manual optimization, CPU, two optimizers with a shared parameter;
tests/_migrate_plain.py, also in a process that never imports toggleshim) or on a stand-in trainer
(``trainer.optimizers`` only, for the Hypothesis property). The original runs on Lightning's own
methods (the patch uninstalled), the migrated one on the patch; code on its way back
(``--to-lightning``) runs without toggleshim.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from _migrate_plain import BATCHES, fit_plain, module_class, world

import toggleshim
from toggleshim._migrate import migrate_source, to_lightning_source
from toggleshim.testing import installed_flavours

TEMPLATE = '''\
"""A two-optimizer module (rendered by tests/_migrate_world.py)."""
import copy

import torch
from torch import nn
import FLAVOUR as pl


class Spy:
    """User code behind expressions that look harmless: each way Python lets an expression run code
    (``__format__`` in an f-string, ``__iter__`` when unpacked, a property, ``__getitem__``,
    comparisons, operators, ``__bool__``, a call) does what its ``mode`` says: ``read`` reads
    gradients, parameters and optimizer state into the module's trace; ``write`` changes them (sets
    or halves every ``.grad``, moves a parameter, lowers each ``lr`` and halves each optimizer's
    per-parameter state, ``momentum_buffer``, ``exp_avg``...); ``state`` changes the optimizer state
    alone (the test that a move across such a line is seen)."""

    def __init__(self, module, opts, mode):
        self.module, self.opts, self.mode = module, opts, mode

    def touch(self):
        if self.mode == "read":
            self.module.observe()
            self.module.trace.append([copy.deepcopy(o.state_dict()) for o in self.opts])
            return 1
        with torch.no_grad():
            if self.mode == "write":
                for p in self.module.parameters():  # a zero_grad() moved across this is seen either way
                    p.grad = torch.full_like(p, 0.5) if p.grad is None else p.grad.mul_(0.5)
                self.module.c.add_(0.25)
                for o in self.opts:
                    o.param_groups[0]["lr"] *= 0.9
            for o in self.opts:
                for state in o.state.values():
                    for key, value in state.items():
                        if key != "step" and torch.is_tensor(value):  # Adam's step count stays a count
                            value.mul_(0.5)
        return 1

    def __format__(self, spec):
        self.touch()
        return ""

    def __repr__(self):
        self.touch()
        return "Spy()"

    def __iter__(self):
        self.touch()
        return iter((1, 2))

    @property
    def value(self):
        return self.touch()

    def __getitem__(self, key):
        return self.touch()

    def __eq__(self, other):
        return self.touch() == other

    def __lt__(self, other):
        return self.touch() < other

    def __add__(self, other):
        return self.touch() + other

    def __bool__(self):
        return bool(self.touch())

    def __call__(self):
        return self.touch()

    __hash__ = None


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        gen = torch.Generator().manual_seed(0)
        self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)
        self.c = nn.Parameter(torch.ones(2))  # held by both optimizers
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        self.trace = []

    def observe(self):
        """Reads every parameter, gradient and requires_grad (so it is no inert line)."""
        self.trace.append([(p.requires_grad, p.detach().clone(), None if p.grad is None else p.grad.clone())
                           for p in self.parameters()])

    def loss(self, x, which):
        net = self.a if which == 0 else self.b
        return ((net(x) + self.c) ** 2).sum()

    def configure_optimizers(self):
        return [torch.optim.SGD([*self.a.parameters(), self.c], lr=0.1, momentum=0.9),
                torch.optim.Adam([*self.b.parameters(), self.c], lr=0.01)]

    def train_dataloader(self):
        gen = torch.Generator().manual_seed(1)
        data = torch.randn(BATCHES, 3, generator=gen)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opts = self.optimizers()
        g_opt, d_opt = opts
BODY
'''

def render(body: str, flavour: str | None = None) -> str:
    """The module source with ``body`` (statement style, unindented) as training_step's tail, on the
    Lightning ``flavour`` (default: the first installed one)."""
    source = TEMPLATE.replace("FLAVOUR", flavour or installed_flavours()[0])
    return source.replace("BODY", textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8))


def migrated(source: str, assume: frozenset[str] = frozenset()) -> str:
    """``source`` as ``toggleshim migrate [--assume NAME...]`` rewrites it (checked: it parses, and a
    second run changes nothing)."""
    out = migrate_source(source.encode(), assume=assume).new.decode()
    compile(out, "<migrated>", "exec")  # never emits code that does not parse
    assert migrate_source(out.encode(), assume=assume).new.decode() == out, "a second run changed something"
    return out


def to_lightning(source: str) -> str:
    """``source`` as ``toggleshim migrate --to-lightning`` rewrites it (checked: it parses, and a second
    run changes nothing)."""
    out = to_lightning_source(source.encode()).new.decode()
    compile(out, "<to-lightning>", "exec")
    assert to_lightning_source(out.encode()).new.decode() == out, "a second run changed something"
    return out


def fit(source: str, patched: bool, flavour: str | None = None) -> dict[str, Any]:
    """Train the module of ``source`` in a real Trainer.fit of ``flavour`` in this process, on the patch
    or on Lightning's own methods (``patched``); the world afterwards."""
    toggleshim.install() if patched else toggleshim.uninstall()
    try:
        return fit_plain(source, flavour or installed_flavours()[0])
    finally:
        toggleshim.install()


def fit_without_toggleshim(sources: list[str], flavour: str | None = None) -> list[dict[str, Any]]:
    """Train each module of ``sources`` in a real Trainer.fit, in one fresh process that never imports
    toggleshim (tests/_migrate_plain.py fails when it did); the worlds afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        given, out = Path(tmp) / "sources.json", Path(tmp) / "worlds.pt"
        given.write_text(json.dumps(sources))
        script = Path(__file__).with_name("_migrate_plain.py")
        proc = subprocess.run([sys.executable, str(script), str(given), flavour or installed_flavours()[0], str(out)],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        worlds: list[dict[str, Any]] = torch.load(out, weights_only=False)
    return worlds


def on_stand_in(source: str, patched: bool, batches: int = BATCHES) -> dict[str, Any]:
    """The same world on a stand-in trainer (``trainer.optimizers`` only); ``self.optimizers()`` then
    returns the torch optimizers."""
    toggleshim.install() if patched else toggleshim.uninstall()
    try:
        cls = module_class(source)
        module = cls()
        optimizers = module.configure_optimizers()
        module._trainer = SimpleNamespace(optimizers=optimizers, strategy=SimpleNamespace())
        module.optimizers = lambda: optimizers
        gen = torch.Generator().manual_seed(1)
        data = torch.randn(batches, 3, generator=gen)
        for i in range(batches):
            module.training_step((data[i : i + 1],), i)
        return world(module, optimizers, 0)
    finally:
        toggleshim.install()


def assert_same_world(a: Any, b: Any, where: str = "world") -> None:
    """Bitwise equality of nested worlds: tensors by dtype, shape and bits; None stays None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), f"{where}: {a!r} vs {b!r}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        assert torch.equal(a.view(-1).view(torch.uint8) if a.dtype.is_floating_point else a,
                           b.view(-1).view(torch.uint8) if b.dtype.is_floating_point else b), f"{where}: {a} vs {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {a.keys()} vs {b.keys()}"
        for k in a:
            assert_same_world(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_world(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"
