"""Modules with their own data for ``assert_trains_like_manual`` (``test_trains_like_manual.py`` and
the planted-bug runs it starts in fresh processes), one class per Lightning flavour.

* :func:`gan`: the tiny GAN of ``_training_models`` with its data: blocks (``style="block"``) or
  ``toggleshim.toggle`` (``"typed"``), accumulation (the flags), LR schedulers.
* :func:`nested`: a block inside a block, a statement toggle inside a block, a block inside an open
  statement toggle: toggleshim's nesting, which has no manual sequence.
* :func:`overrides`: a class whose ``toggle_optimizer`` and ``untoggle_optimizer`` call ``super()``
  (a count; fine-tuning that keeps the backbone's bias frozen after every untoggle).
"""

from __future__ import annotations

from typing import Any

import _training_models as M
import torch

import toggleshim

BATCHES = 6  # batches of every module's data (batch size 4)


def gan(flavour: str, style: str = "block", accumulate: int = 1, schedulers: bool = False) -> Any:
    """``make`` for the tiny GAN: a fresh module with its data."""

    class GAN(M.gan_class(M.flavour_module(flavour))):  # type: ignore[misc]
        def train_dataloader(self) -> Any:
            return M.loader(BATCHES * 4, 4)

    return lambda: GAN(style=style, accumulate=accumulate, schedulers=schedulers, lr=0.05)


def nested(flavour: str, made: list[Any] | None = None) -> Any:
    """``make`` for a module whose training step nests toggles (five steps a batch); each module made is
    appended to ``made``. ``inside`` records, in every nested toggle (three a batch), whether exactly
    the inner optimizer's parameters train."""

    class Nested(M.flavour_module(flavour).LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            gen = torch.Generator().manual_seed(0)
            self.generator, self.discriminator = M.mlp([M.LATENT, 8, 2], gen), M.mlp([2, 8, 1], gen)
            # in no optimizer: never toggled, so a loss always needs a gradient (a wrong nesting that
            # freezes a network shows as a difference, not as an error of backward)
            self.scale = torch.nn.Parameter(torch.ones(()))
            self.inside: list[bool] = []

        def configure_optimizers(self) -> Any:
            return [torch.optim.Adam(self.generator.parameters(), lr=0.05),
                    torch.optim.SGD(self.discriminator.parameters(), lr=0.1, momentum=0.9)]

        def _trains(self, *nets: Any) -> bool:
            """Exactly the parameters of ``nets`` are trainable."""
            return all(p.requires_grad == any(p is q for n in nets for q in n.parameters())
                       for p in self.parameters() if p is not self.scale)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, z = batch
            g_opt, d_opt = self.optimizers()
            fake = lambda: self.scale * self.discriminator(self.generator(z))  # noqa: E731
            with self.toggle_optimizer(d_opt):  # a block inside a block
                self.manual_backward(self.discriminator(x).mean() - fake().mean())
                with self.toggle_optimizer(g_opt):
                    self.inside.append(self._trains(self.generator))
                    self.manual_backward(-fake().mean())
            with self.toggle_optimizer(g_opt, step=False):  # a statement toggle inside a block
                self.toggle_optimizer(d_opt)
                self.inside.append(self._trains(self.discriminator))
                d_opt.zero_grad()
                self.manual_backward(fake().square().mean())
                d_opt.step()
                self.untoggle_optimizer(d_opt)
                self.manual_backward(fake().abs().mean())
                g_opt.step()
            self.toggle_optimizer(d_opt)  # a block inside an open statement toggle
            with self.toggle_optimizer(g_opt, zero_grad=False):
                self.inside.append(self._trains(self.generator))
                self.manual_backward(fake().mean())
            self.untoggle_optimizer(d_opt)

        def train_dataloader(self) -> Any:
            return M.loader(BATCHES * 4, 4)

    def make() -> Any:
        module = Nested()
        if made is not None:
            made.append(module)
        return module

    return make


def overrides(flavour: str, typed: bool = False, made: list[Any] | None = None) -> Any:
    """``make`` for a backbone with two heads whose class overrides both methods, calling ``super()``;
    ``typed``: the blocks through ``toggleshim.toggle(self, opt)``."""

    class FineTuned(M.flavour_module(flavour).LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            gen = torch.Generator().manual_seed(0)
            self.backbone = M.mlp([2, 4], gen)
            self.head_a, self.head_b = M.mlp([4, 1], gen), M.mlp([4, 1], gen)
            self.calls = {"toggle": 0, "untoggle": 0}

        def toggle_optimizer(self, optimizer: Any, **flags: Any) -> Any:
            self.calls["toggle"] += 1
            return super().toggle_optimizer(optimizer, **flags)

        def untoggle_optimizer(self, optimizer: Any) -> None:
            self.calls["untoggle"] += 1
            super().untoggle_optimizer(optimizer)
            self.backbone[0].bias.requires_grad_(False)  # fine-tuning: the backbone's bias stays as it is

        def configure_optimizers(self) -> Any:
            a = torch.optim.Adam([*self.backbone.parameters(), *self.head_a.parameters()], lr=0.05)
            b = torch.optim.SGD([*self.head_b.parameters(), self.backbone[0].weight], lr=0.1, momentum=0.9)
            return [a, b]

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, _ = batch
            for opt, head in zip(self.optimizers(), (self.head_a, self.head_b)):
                with toggleshim.toggle(self, opt) if typed else self.toggle_optimizer(opt):
                    self.manual_backward(head(self.backbone(x)).square().mean())

        def train_dataloader(self) -> Any:
            return M.loader(BATCHES * 4, 4)

    def make() -> Any:
        module = FineTuned()
        if made is not None:
            made.append(module)
        return module

    return make
