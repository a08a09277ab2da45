"""The patched method in a `with`: mypy reads Lightning's `-> None` and rejects it (tests/test_typing.py)."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule


class GAN(LightningModule):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        opt = self.optimizers()
        with self.toggle_optimizer(opt):
            pass
