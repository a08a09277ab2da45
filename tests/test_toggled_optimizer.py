"""README "Why not `toggled_optimizer`?": each row of the side-by-side, shown by running both.

Lightning >= 2.5.1 has ``with self.toggled_optimizer(opt):`` (toggle, ``try: yield``, untoggle in
``finally``). Each test runs toggleshim's block and Lightning's ``toggled_optimizer`` under a real
``Trainer.fit`` (manual optimization, two optimizers), in both flavours. On a Lightning older than 2.5.1
the method does not exist: there each test asserts that (and that the version says so), and runs
toggleshim's half alone. Lightning's half runs without toggleshim (``lightning_original``): with
toggleshim installed, ``toggled_optimizer``'s own ``self.toggle_optimizer(opt)`` call is toggleshim's
statement toggle (a bad optimizer is then toggleshim's ``ValueError``).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import _training_models as M
import pytest
import torch
from _training_models import one_thread  # noqa: F401  (an autouse fixture)

from toggleshim.testing import installed_flavours

ROOT = Path(__file__).resolve().parent.parent
BATCHES = 3


def _has_toggled_optimizer(flavour: str) -> bool:
    """Whether this Lightning has ``toggled_optimizer``: exactly from 2.5.1 on (asserted, so that an
    older Lightning is a checked absence, not a skip)."""
    pl = M.flavour_module(flavour)
    version = tuple(int(n) for n in re.findall(r"\d+", pl.__version__)[:3])
    has = hasattr(pl.LightningModule, "toggled_optimizer")
    assert has == (version >= (2, 5, 1)), (pl.__version__, has)
    return has


def _fit(flavour: str, body: Any, batches: int = BATCHES, lightning: bool = False) -> tuple[Any, Any]:
    """A two-optimizer module (generator, discriminator; ``loose``: in no optimizer) fitted for ``batches``
    batches; ``body(module, x, z)`` is its training step. ``lightning``: toggleshim uninstalled meanwhile."""
    if lightning:
        with M.lightning_original():
            return _fit(flavour, body, batches)
    pl = M.flavour_module(flavour)

    class Probe(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            gen = torch.Generator().manual_seed(0)
            self.generator, self.discriminator = M.mlp([M.LATENT, 4, 2], gen), M.mlp([2, 4, 1], gen)
            self.loose = M.mlp([2, 1], gen)
            self.initial = [p.detach().clone() for p in self.parameters()]
            self.seen: list[Any] = []

        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.generator.parameters(), lr=0.1, momentum=0.9),
                    torch.optim.SGD(self.discriminator.parameters(), lr=0.1, momentum=0.9)]

        def d_loss(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            return self.discriminator(x).mean() - self.discriminator(self.generator(z)).mean()

        def trainable(self) -> dict[str, bool]:
            return {"generator": all(p.requires_grad for p in self.generator.parameters()),
                    "discriminator": all(p.requires_grad for p in self.discriminator.parameters())}

        def training_step(self, batch: Any, batch_idx: int) -> None:
            body(self, *batch)

        def train_dataloader(self) -> Any:
            return M.loader(batches * 4, 4)

    module = Probe()
    trainer = pl.Trainer(max_epochs=1, devices=1, **M.TRAINER_DEFAULTS)
    trainer.fit(module)
    return module, trainer


def _unchanged(module: Any) -> bool:
    return all(torch.equal(a, b) for a, b in zip(module.initial, module.parameters()))


# -- flags


def test_flags_lightning_takes_none_toggleshim_three(flavour: str) -> None:
    def block(m: Any, x: torch.Tensor, z: torch.Tensor) -> None:  # accumulate: no zero_grad, no step
        with m.toggle_optimizer(m.optimizers()[1], zero_grad=False, step=False, sync_grad=False):
            m.manual_backward(m.d_loss(x, z))

    shim, trainer = _fit(flavour, block)
    assert trainer.global_step == 0 and _unchanged(shim)  # step=False
    params = list(shim.discriminator.parameters())
    summed = [torch.zeros_like(p) for p in params]
    for x, z in M.loader(BATCHES * 4, 4):
        for total, grad in zip(summed, torch.autograd.grad(shim.d_loss(x, z), params)):
            total += grad
    assert all(torch.allclose(p.grad, total) for p, total in zip(params, summed))  # zero_grad=False: every batch's
    if not _has_toggled_optimizer(flavour):
        return
    lightning = M.flavour_module(flavour).LightningModule
    assert list(inspect.signature(lightning.toggled_optimizer).parameters) == ["self", "optimizer"]

    def flagged(m: Any, x: torch.Tensor, z: torch.Tensor) -> None:
        with pytest.raises(TypeError, match="unexpected keyword argument 'step'"):
            m.toggled_optimizer(m.optimizers()[1], step=False).__enter__()
        m.seen.append("refused")

    module, _ = _fit(flavour, flagged, batches=1, lightning=True)
    assert module.seen == ["refused"]


# -- zero_grad and step


def test_zero_grad_and_step_lightnings_are_yours_toggleshims_are_done(flavour: str) -> None:
    """toggleshim's block zeroes and steps; Lightning's body does neither unless written: written, the
    two train bit for bit alike."""

    def block(m: Any, x: torch.Tensor, z: torch.Tensor) -> None:
        with m.toggle_optimizer(m.optimizers()[1]):
            m.manual_backward(m.d_loss(x, z))

    shim, trainer = _fit(flavour, block)
    assert trainer.global_step == BATCHES and not _unchanged(shim)
    if not _has_toggled_optimizer(flavour):
        return

    def bare(m: Any, x: torch.Tensor, z: torch.Tensor) -> None:
        with m.toggled_optimizer(m.optimizers()[1]):
            m.manual_backward(m.d_loss(x, z))

    def written(m: Any, x: torch.Tensor, z: torch.Tensor) -> None:
        d_opt = m.optimizers()[1]
        with m.toggled_optimizer(d_opt):
            d_opt.zero_grad()
            m.manual_backward(m.d_loss(x, z))
            d_opt.step()

    lightning, trainer = _fit(flavour, bare, lightning=True)
    assert trainer.global_step == 0 and _unchanged(lightning)
    lightning, trainer = _fit(flavour, written, lightning=True)
    assert trainer.global_step == BATCHES
    assert all(torch.equal(a, b) for a, b in zip(lightning.parameters(), shim.parameters()))


# -- an exception in the body


class Boom(Exception):
    pass


def test_an_exception_both_untoggle_and_reraise_toggleshim_takes_no_step(flavour: str) -> None:
    """The same exception object comes out of both, everything is trainable again; Lightning's body had
    already stepped (its step stays), toggleshim's exit takes no step."""
    errors = [Boom() for _ in range(BATCHES)]

    def run(context: str) -> Any:
        def body(m: Any, x: torch.Tensor, z: torch.Tensor) -> None:
            d_opt, error = m.optimizers()[1], errors[len(m.seen)]
            try:
                if context == "block":
                    with m.toggle_optimizer(d_opt):
                        m.manual_backward(m.d_loss(x, z))
                        raise error
                with m.toggled_optimizer(d_opt):
                    d_opt.zero_grad()
                    m.manual_backward(m.d_loss(x, z))
                    d_opt.step()
                    raise error
            except Boom as caught:
                m.seen.append((caught is error, m.trainable()))

        return _fit(flavour, body, lightning=context != "block")

    shim, trainer = run("block")
    assert shim.seen == [(True, {"generator": True, "discriminator": True})] * BATCHES
    assert trainer.global_step == 0 and _unchanged(shim)
    if not _has_toggled_optimizer(flavour):
        return
    lightning, trainer = run("toggled_optimizer")
    assert lightning.seen == shim.seen
    assert trainer.global_step == BATCHES and not _unchanged(lightning)


# -- nesting


def test_nesting_lightning_freezes_the_inner_optimizer_for_good_toggleshim_trains_it(flavour: str) -> None:
    def run(context: str) -> Any:
        def body(m: Any, x: torch.Tensor, z: torch.Tensor) -> None:
            g_opt, d_opt = m.optimizers()
            outer = m.toggle_optimizer(d_opt) if context == "block" else m.toggled_optimizer(d_opt)
            with outer:
                if context == "block":
                    m.manual_backward(m.d_loss(x, z))
                inner = m.toggle_optimizer(g_opt) if context == "block" else m.toggled_optimizer(g_opt)
                with inner:
                    m.seen.append(("inside", m.trainable()))
                    if context == "block":
                        m.manual_backward(-m.discriminator(m.generator(z)).mean())
            m.seen.append(("after", m.trainable()))

        return _fit(flavour, body, lightning=context != "block")

    shim, trainer = run("block")
    assert shim.seen == [("inside", {"generator": True, "discriminator": False}),
                         ("after", {"generator": True, "discriminator": True})] * BATCHES
    assert trainer.global_step == 2 * BATCHES
    if not _has_toggled_optimizer(flavour):
        return
    lightning, _ = run("toggled_optimizer")
    assert lightning.seen == [("inside", {"generator": False, "discriminator": False}),
                              ("after", {"generator": False, "discriminator": True})] * BATCHES
    assert not any(p.requires_grad for p in lightning.generator.parameters())  # after the fit too


# -- a bad optimizer


def test_a_bad_optimizer_lightning_freezes_everything_toggleshim_changes_nothing(flavour: str) -> None:
    """An optimizer over ``loose``, a parameter no trainer optimizer holds."""

    def run(context: str) -> Any:
        def body(m: Any, x: torch.Tensor, z: torch.Tensor) -> None:
            bad = torch.optim.SGD(m.loose.parameters(), lr=0.1)
            try:
                with m.toggle_optimizer(bad) if context == "block" else m.toggled_optimizer(bad):
                    pass
            except Exception as e:
                m.seen.append((type(e), str(e), m.trainable(), m.loose[0].weight.requires_grad))

        return _fit(flavour, body, batches=1, lightning=context != "block")

    ((kind, message, trainable, loose),) = run("block")[0].seen
    assert kind is ValueError and "'loose.0.weight'" in message and "nothing was changed" in message
    assert trainable == {"generator": True, "discriminator": True} and loose
    if not _has_toggled_optimizer(flavour):
        return
    ((kind, message, trainable, loose),) = run("toggled_optimizer")[0].seen
    assert kind is KeyError and message.startswith("Parameter containing:")  # the tensor's repr, nothing more
    assert trainable == {"generator": False, "discriminator": False} and loose


# -- typed code


def _typed_source(flavours: list[str]) -> str:
    lines = ["from __future__ import annotations", "import torch", "from toggleshim import toggle"]
    for i, flavour in enumerate(flavours):
        lines += [
            f"import {flavour} as pl{i}",
            f"class Typed{i}(pl{i}.LightningModule):",
            "    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:",
            "        opt = self.optimizers()",
            "        assert not isinstance(opt, list)",
            f"        with toggle(self, opt) as typed:  # toggleshim {i}",
            "            reveal_type(typed)",
            f"        with self.toggle_optimizer(opt):  # patched {i}",
            "            pass",
        ]
        if _has_toggled_optimizer(flavour):
            lines += [f"        with self.toggled_optimizer(opt) as lightnings:  # lightning {i}",
                      "            reveal_type(lightnings)"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def mypy_said(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str]:
    """``mypy --strict`` (Lightning's and torch's types read, as in ``tests/typing``) on one file with a
    module of each installed flavour: the file's lines and mypy's output."""
    folder = tmp_path_factory.mktemp("typed")
    source = _typed_source(installed_flavours())
    (folder / "typed.py").write_text(source)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "tests" / "typing" / "mypy.ini"),
         "--cache-dir", str(folder / "cache"), "typed.py"],
        cwd=folder, capture_output=True, text=True, timeout=600, check=False)
    return source.splitlines(), proc.stdout + proc.stderr


def _said_at(mypy_said: tuple[list[str], str], tag: str, offset: int = 0) -> list[str]:
    """What mypy said about the line tagged ``# tag`` (``offset`` lines below it)."""
    lines, out = mypy_said
    number = next(n for n, line in enumerate(lines, 1) if line.endswith(f"# {tag}")) + offset
    return re.findall(rf"^typed\.py:{number}: (.*)$", out, re.MULTILINE)


def test_typed_code_lightnings_block_yields_any_toggleshims_the_optimizer(
    flavour: str, mypy_said: tuple[list[str], str]
) -> None:
    i = installed_flavours().index(flavour)
    assert _said_at(mypy_said, f"toggleshim {i}") == []
    assert _said_at(mypy_said, f"toggleshim {i}", 1) == [
        f'note: Revealed type is "{flavour}.core.optimizer.LightningOptimizer"']
    assert any("does not return a value" in said for said in _said_at(mypy_said, f"patched {i}")), mypy_said[1]
    if not _has_toggled_optimizer(flavour):
        return
    assert _said_at(mypy_said, f"lightning {i}") == []
    assert _said_at(mypy_said, f"lightning {i}", 1) == ['note: Revealed type is "Any"']
