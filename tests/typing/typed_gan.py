"""The README's typed example: mypy --strict accepts it (``.ci/run``, "typing")."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import nn

import toggleshim
from toggleshim import toggle


class GAN(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Linear(2, 2)
        self.discriminator = nn.Linear(2, 1)
        self.automatic_optimization = False

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        opts = self.optimizers()
        assert isinstance(opts, list)  # Lightning types it as one-or-a-list
        g_opt, d_opt = opts
        with toggle(self, d_opt):  # a Toggle[LightningOptimizer]: type checkers accept the block
            self.manual_backward(self.discriminator(batch).mean())
        block: toggleshim.Toggle[LightningOptimizer] = toggle(self, g_opt, zero_grad=False, step=True)
        with block as g:
            g.zero_grad()
            self.manual_backward(self.discriminator(self.generator(batch)).mean())

    def discriminator_step(self, batch: torch.Tensor, d_opt: LightningOptimizer) -> torch.Tensor:
        # The block never swallows an exception (its __exit__ returns Literal[False]): a return
        # inside it needs no return after it
        with toggle(self, d_opt):
            loss: torch.Tensor = self.discriminator(batch).mean()
            self.manual_backward(loss)
            return loss
