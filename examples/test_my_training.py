"""Check *your own* training code: the README's GAN, fitted through toggleshim and with every block
expanded into Lightning's manual sequence, compared bit for bit.

    pytest examples/test_my_training.py

``GAN`` is the README's, as written (``tests/test_readme.py`` checks it). Replace it with your own
LightningModule: ``make`` (here the class itself) returns a fresh module with its own data;
``max_steps`` and any ``Trainer`` options go to both fits.
"""

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import toggleshim  # noqa: F401  (once, anywhere before training)
from toggleshim.testing import assert_trains_like_manual


class GAN(LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False     # manual optimization: you drive the optimizers
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 1))

    def configure_optimizers(self):
        return [torch.optim.Adam(self.generator.parameters(), lr=2e-4),
                torch.optim.Adam(self.discriminator.parameters(), lr=2e-4)]

    def training_step(self, batch, batch_idx):
        real, z = batch
        g_opt, d_opt = self.optimizers()
        bce = F.binary_cross_entropy_with_logits
        with self.toggle_optimizer(d_opt):      # G frozen now; d_opt.zero_grad()
            d_real, d_fake = self.discriminator(real), self.discriminator(self.generator(z))
            d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
            self.manual_backward(d_loss)
                                                # d_opt.step(), then untoggle (on an exception: untoggle only)
        with self.toggle_optimizer(g_opt):      # D frozen
            d_gen = self.discriminator(self.generator(z))
            g_loss = bce(d_gen, torch.ones_like(d_gen))
            self.manual_backward(g_loss)
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})


class MyGAN(GAN):
    def train_dataloader(self):  # your own data (both fits start from the same seed)
        return DataLoader(TensorDataset(torch.randn(128, 2), torch.randn(128, 8)), batch_size=16)


def test_my_gan_trains_like_manual():
    assert_trains_like_manual(MyGAN, max_steps=16)  # 8 batches, two optimizer steps each


def test_my_gan_trains_both_networks_and_counts_every_step():
    """Your training logic, which ``assert_trains_like_manual`` cannot see (it compares two runs of the
    same ``training_step``): one batch trains both networks, and Lightning counts both steps (a raw
    ``torch.optim.Optimizer`` in a block would leave ``global_step`` at 0)."""
    from lightning.pytorch import Trainer

    torch.manual_seed(0)
    model = MyGAN()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    assert trainer.global_step == 2  # one batch: the discriminator's step and the generator's
    assert all(not torch.equal(before[name], p) for name, p in model.named_parameters())
