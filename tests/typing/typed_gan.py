"""The README's typed example: mypy --strict accepts it (tests/test_typing.py)."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import nn

from toggleshim import Toggle, toggle


class GAN(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Linear(2, 2)
        self.discriminator = nn.Linear(2, 1)
        self.automatic_optimization = False

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        g_opt, d_opt = self.optimizers()  # type: ignore[misc]  # Lightning types it as a union
        d_block: Toggle[torch.optim.Optimizer] = toggle(self, d_opt)
        with d_block as opt:
            opt.zero_grad()
            self.manual_backward(self.discriminator(batch).mean())
        with toggle(self, g_opt, zero_grad=False, step=True):
            self.manual_backward(self.discriminator(self.generator(batch)).mean())
