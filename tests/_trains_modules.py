"""Modules with their own data for ``assert_trains_like_manual`` (``test_trains_like_manual.py`` and
the planted-bug runs it starts in fresh processes), one class per Lightning flavour.

* :func:`gan`: the tiny GAN of ``_training_models`` with its data: blocks (``style="block"``) or
  ``toggleshim.toggle`` (``"typed"``), accumulation (the flags), LR schedulers.
* :func:`nested`: a block inside a block, a statement toggle inside a block, a block inside an open
  statement toggle: toggleshim's nesting, which has no manual sequence.
* :func:`overrides`: ``test_user_methods``' classes whose ``toggle_optimizer`` and ``untoggle_optimizer``
  are the module's own (calling ``super()``, or not).
"""

from __future__ import annotations

from typing import Any

import _training_models as M
import torch

BATCHES = 6  # batches of every module's data (batch size 4)


def gan(flavour: str, style: str = "block", accumulate: int = 1, schedulers: bool = False, probe: bool = False,
        made: list[Any] | None = None) -> Any:
    """``make`` for the tiny GAN: a fresh module with its data (``probe``: it records DDP's gradient sync
    flag after every backward)."""

    class GAN(M.gan_class(M.flavour_module(flavour))):  # type: ignore[misc]
        def train_dataloader(self) -> Any:
            return M.loader(BATCHES * 4, 4)

    return _recording(lambda: GAN(style=style, accumulate=accumulate, schedulers=schedulers, probe=probe, lr=0.05),
                      made)


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

    return _recording(Nested, made)


def overrides(flavour: str, toggle: str | None = "super", untoggle: str = "refreeze", entry: str = "method",
              made: list[Any] | None = None) -> Any:
    """``make`` for ``test_user_methods``' backbone with two heads, whose class overrides
    ``toggle_optimizer`` / ``untoggle_optimizer`` as named there (``"super"``: returns ``super()``'s
    toggle, then freezes the backbone's bias; ``"refreeze"``: ``super()``, then freezes the backbone
    (fine-tuning); ``"log"``: ``super()`` and a count; ``"own"``: never calls ``super()``); ``entry``:
    ``"method"`` (``with self.toggle_optimizer(opt):``) or ``"toggle"`` (``toggleshim.toggle``)."""
    from test_user_methods import _module_class

    cls = _module_class(flavour, toggle, untoggle)
    return _recording(lambda: cls(entry), made)


def _recording(make: Any, made: list[Any] | None) -> Any:
    """``make``, appending each module it makes to ``made``."""

    def recorded() -> Any:
        module = make()
        if made is not None:
            made.append(module)
        return module

    return recorded
