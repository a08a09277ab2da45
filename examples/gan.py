"""A small GAN on a 2-D mixture of Gaussians, trained with toggleshim's block (CPU; its time: the README).

    python examples/gan.py                          # writes gan.png when matplotlib is installed
    python examples/gan.py --steps 300 --out /tmp/gan.png
    python examples/gan.py --flavour pytorch_lightning

Each training step is two blocks, one per optimizer::

    with self.toggle_optimizer(d_opt):    # only D trains (G frozen); d_opt.zero_grad() on entry
        d_loss = ...
        self.manual_backward(d_loss)
                                          # clean exit: d_opt.step(), then untoggle
    with self.toggle_optimizer(g_opt):    # only G trains (D frozen)
        g_loss = ...
        self.manual_backward(g_loss)
    self.log_dict({"d_loss": d_loss, ...})  # values computed inside the blocks, logged after them

The data (eight Gaussians on a ring) and the noise come from a seeded ``torch.Generator``: nothing is
downloaded and a run is reproducible. The picture (real vs generated samples, loss curves) needs the
optional ``matplotlib`` (``pip install toggleshim[examples]``); without it the script only trains.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

import toggleshim  # noqa: F401  (patches toggle_optimizer on every installed Lightning flavour)

LATENT = 8


def ring_of_gaussians(n: int, gen: torch.Generator, modes: int = 8, radius: float = 2.0,
                      std: float = 0.05) -> torch.Tensor:
    """``n`` samples of a mixture of ``modes`` Gaussians placed on a circle."""
    angle = torch.randint(modes, (n,), generator=gen).float() * (2 * math.pi / modes)
    centres = radius * torch.stack([angle.cos(), angle.sin()], dim=1)
    return centres + std * torch.randn(n, 2, generator=gen)


def make_data(steps: int, batch_size: int, seed: int) -> DataLoader[Any]:
    """One epoch of ``steps`` batches of (real sample, generator noise)."""
    gen = torch.Generator().manual_seed(seed)
    n = steps * batch_size
    real, noise = ring_of_gaussians(n, gen), torch.randn(n, LATENT, generator=gen)
    # ready-made batches (batch_size=None): no per-sample indexing and collating
    batches: Any = list(zip(real.split(batch_size), noise.split(batch_size)))
    return DataLoader(batches, batch_size=None)


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.LeakyReLU(0.2)]
    return nn.Sequential(*layers[:-1])


def make_gan_class(L: Any) -> type:
    """The GAN on Lightning flavour ``L`` (``lightning.pytorch`` or ``pytorch_lightning``)."""

    class GAN(L.LightningModule):
        def __init__(self, hidden: int = 64, lr: float = 1e-3) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.lr = lr
            self.generator = mlp(LATENT, hidden, hidden, 2)
            self.discriminator = mlp(2, hidden, hidden, 1)

        def configure_optimizers(self) -> Any:
            betas = (0.5, 0.999)
            return (torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=betas),
                    torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=betas))

        def training_step(self, batch: Any, batch_idx: int) -> None:
            real, z = batch
            g_opt, d_opt = self.optimizers()
            bce = nn.functional.binary_cross_entropy_with_logits

            with self.toggle_optimizer(d_opt):
                # no .detach() needed: the block froze the generator's parameters
                d_real, d_fake = self.discriminator(real), self.discriminator(self.generator(z))
                d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
                self.manual_backward(d_loss)

            with self.toggle_optimizer(g_opt):
                d_gen = self.discriminator(self.generator(z))
                g_loss = bce(d_gen, torch.ones_like(d_gen))
                self.manual_backward(g_loss)

            self.log_dict({
                "d_loss": d_loss.detach(),
                "g_loss": g_loss.detach(),
                "d_real": torch.sigmoid(d_real).mean().detach(),  # D's belief that real samples are real
                "d_fake": torch.sigmoid(d_fake).mean().detach(),
            }, prog_bar=True)

        @torch.no_grad()
        def sample(self, n: int, seed: int = 1) -> torch.Tensor:
            gen = torch.Generator().manual_seed(seed)
            out: torch.Tensor = self.generator(torch.randn(n, LATENT, generator=gen))
            return out

    return GAN


@dataclass
class Result:
    model: Any
    trainer: Any
    history: dict[str, list[float]] = field(default_factory=dict)
    png: Path | None = None


def _history_callback(L: Any, history: dict[str, list[float]], print_every: int) -> Any:
    class LossHistory(L.Callback):
        """Collects the logged values after every step and prints them now and then."""

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            metrics = trainer.callback_metrics  # a property that gathers the logged values: read once
            for key, value in metrics.items():
                history.setdefault(key, []).append(float(value))
            if print_every and (batch_idx % print_every == 0 or batch_idx == trainer.num_training_batches - 1):
                values = "  ".join(f"{k} {history[k][-1]:.3f}" for k in sorted(metrics))
                print(f"step {batch_idx:5d}  {values}", flush=True)

    return LossHistory()


def _smooth(values: list[float], width: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - width] if i >= width else 0.0)
        out.append(total / min(i + 1, width))
    return out


def draw(result: Result, path: Path, seed: int) -> Path | None:
    """Real vs generated samples and the loss curves as a PNG; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no picture (pip install toggleshim[examples])")
        return None
    real = ring_of_gaussians(2000, torch.Generator().manual_seed(seed + 1))
    fake = result.model.sample(2000, seed=seed + 2)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6))
    left.scatter(real[:, 0], real[:, 1], s=3, alpha=0.35, color="0.45", label="real")
    left.scatter(fake[:, 0], fake[:, 1], s=3, alpha=0.35, color="tab:orange", label="generated")
    left.set_aspect("equal")
    left.set_xlim(-3, 3)
    left.set_ylim(-3, 3)
    left.legend(loc="upper right", markerscale=4)
    left.set_title("samples")
    width = max(1, len(result.history.get("d_loss", [])) // 50)
    for key, colour in (("d_loss", "tab:blue"), ("g_loss", "tab:red")):
        values = result.history.get(key, [])
        right.plot(values, color=colour, alpha=0.2, linewidth=0.8)
        right.plot(_smooth(values, width), color=colour, label=key)
    right.axhline(2 * math.log(2), color="tab:blue", linestyle=":", linewidth=1, label="d_loss at equilibrium")
    right.axhline(math.log(2), color="tab:red", linestyle=":", linewidth=1, label="g_loss at equilibrium")
    right.set_xlabel("training step")
    right.set_title("losses (logged after the blocks)")
    right.legend(loc="upper right")
    fig.suptitle(f"GAN trained with `with self.toggle_optimizer(opt):` ({result.trainer.global_step // 2} steps)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="training steps (one D and one G update each)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("gan.png"), help="where to write the picture")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=250)
    parser.add_argument("--flavour", choices=["lightning.pytorch", "pytorch_lightning"], default="lightning.pytorch")
    args = parser.parse_args(argv)

    L = importlib.import_module(args.flavour)
    torch.manual_seed(args.seed)  # the initial weights; data and noise have their own generator
    model = make_gan_class(L)()
    history: dict[str, list[float]] = {}
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_history_callback(L, history, args.print_every)],
    )
    trainer.fit(model, make_data(args.steps, args.batch_size, args.seed))
    result = Result(model, trainer, history)
    result.png = draw(result, args.out, args.seed)
    return result


if __name__ == "__main__":
    main()
