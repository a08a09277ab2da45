"""Tiny deterministic Lightning modules for ``test_training.py`` and ``_ddp_script.py``.

Each factory builds the module class for one Lightning flavour (``lightning.pytorch`` or
``pytorch_lightning``). Every module trains in three spellings of the same recipe:

* ``style="block"``: ``with self.toggle_optimizer(opt, zero_grad=..., step=..., sync_grad=...):``
* ``style="typed"``: the same block through ``toggleshim.toggle(self, opt, ...)``
* ``style="manual"``: Lightning's statements (toggle; zero_grad; backward; step; untoggle), or
  ``opt.toggle_model(sync_grad=...)`` when gradients are accumulated over micro-batches. Run it
  inside :func:`lightning_original` to get Lightning's own toggle, not toggleshim's statement form.

Data, noise and initial weights come from seeded ``torch.Generator``s (the noise is part of the batch),
so the spellings see the same numbers and their results can be compared bit for bit.
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import toggleshim

LATENT = 2
TRAINER_DEFAULTS: dict[str, Any] = dict(
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)


def flavour_module(name: str) -> Any:
    """The Lightning flavour module (``lightning.pytorch`` or ``pytorch_lightning``)."""
    return importlib.import_module(name)


@contextmanager
def lightning_original() -> Iterator[None]:
    """Run Lightning's own ``toggle_optimizer``/``untoggle_optimizer`` (the reference), then re-patch."""
    toggleshim.uninstall()
    try:
        yield
    finally:
        toggleshim.install()


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models: one thread is the fastest and does not fight other work for the cores (autouse in
    the test modules that import it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- data ------------------------------------------------------------------------------------


def ring_data(n: int, seed: int = 0, modes: int = 8, radius: float = 2.0, std: float = 0.05) -> TensorDataset:
    """``n`` samples of a 2-D mixture of ``modes`` Gaussians on a ring, each paired with its noise ``z``."""
    gen = torch.Generator().manual_seed(seed)
    angle = torch.randint(modes, (n,), generator=gen).float() * (2 * math.pi / modes)
    centres = radius * torch.stack([angle.cos(), angle.sin()], dim=1)
    x = centres + std * torch.randn(n, 2, generator=gen)
    z = torch.randn(n, LATENT, generator=gen)
    return TensorDataset(x, z)


def loader(n: int, batch_size: int, seed: int = 0) -> DataLoader[Any]:
    return DataLoader(ring_data(n, seed), batch_size=batch_size, shuffle=False)


def mlp(sizes: list[int], gen: torch.Generator) -> nn.Sequential:
    """An MLP with LeakyReLU, initialised from ``gen`` (no global RNG)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        lin = nn.Linear(a, b)
        with torch.no_grad():
            bound = 1 / math.sqrt(a)
            lin.weight.copy_(torch.empty(b, a).uniform_(-bound, bound, generator=gen))
            lin.bias.copy_(torch.empty(b).uniform_(-bound, bound, generator=gen))
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(nn.LeakyReLU(0.2))
    return nn.Sequential(*layers)


def flat_grad(params: Any) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) if p.grad is not None else p.new_zeros(p.numel())
                      for p in params])


# -- the GAN ---------------------------------------------------------------------------------


def gan_class(pl: Any) -> type:
    """A tiny GAN (optimizers: generator, discriminator) on flavour ``pl``."""

    class TinyGAN(pl.LightningModule):
        """Non-saturating GAN, one discriminator block and one generator block per training step.

        ``accumulate``: micro-batches per optimizer step (zero_grad on the first, step and gradient
        sync on the last). ``clip``: norm clipping of the discriminator's gradients inside its block.
        ``schedulers``: StepLR/ExponentialLR stepped after the blocks. ``probe``: record what the
        DDP tests check (gradient sync flag, all-reduce count, gradients after each backward).
        ``explode_at``: at that batch, raise inside a ``sync_grad=False`` block and catch it outside.
        """

        def __init__(self, style: str = "block", hidden: int = 16, lr: float = 2e-3, accumulate: int = 1,
                     clip: float | None = None, schedulers: bool = False, probe: bool = False,
                     explode_at: int | None = None, seed: int = 0) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.style, self.lr, self.accumulate, self.clip = style, lr, accumulate, clip
            self.schedulers, self.probe, self.explode_at = schedulers, probe, explode_at
            gen = torch.Generator().manual_seed(seed)
            self.generator = mlp([LATENT, hidden, hidden, 2], gen)
            self.discriminator = mlp([2, hidden, hidden, 1], gen)
            self.records: list[dict[str, Any]] = []
            self.last: dict[str, float] = {}
            self.comm_calls = 0  # bumped by counting_allreduce_hook (DDP only)
            self.dtypes: set[str] = set()  # dtypes of the discriminator's output (autocast check)

        def configure_optimizers(self) -> Any:
            g_opt = torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=(0.5, 0.9))
            d_opt = torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=(0.5, 0.9))
            if not self.schedulers:
                return [g_opt, d_opt]
            return [g_opt, d_opt], [torch.optim.lr_scheduler.StepLR(g_opt, step_size=2, gamma=0.5),
                                    torch.optim.lr_scheduler.ExponentialLR(d_opt, gamma=0.9)]

        def d_loss(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            # no .detach() on the fake batch: toggling froze the generator, so no gradient reaches it
            real, fake = self.discriminator(x), self.discriminator(self.generator(z))
            self.dtypes.add(str(real.dtype))
            bce = nn.functional.binary_cross_entropy_with_logits
            return bce(real, torch.ones_like(real)) + bce(fake, torch.zeros_like(fake))

        def g_loss(self, z: torch.Tensor) -> torch.Tensor:
            fake = self.discriminator(self.generator(z))
            return nn.functional.binary_cross_entropy_with_logits(fake, torch.ones_like(fake))

        # -- probes --

        def _ddp(self) -> Any:
            model = self.trainer.strategy.model
            return model if hasattr(model, "require_backward_grad_sync") else None

        def on_train_start(self) -> None:
            ddp = self._ddp()
            if self.probe and ddp is not None:
                # Lightning registers its ddp_comm_hook on CUDA only; on CPU (gloo) we do it ourselves
                ddp.register_comm_hook(self, counting_allreduce_hook)

        def _backward(self, loss: torch.Tensor, which: str, batch_idx: int, opt: Any) -> None:
            before = self.comm_calls
            self.manual_backward(loss)
            if self.probe:
                ddp = self._ddp()
                params = [p for g in opt.param_groups for p in g["params"]]
                self.records.append({
                    "batch": batch_idx, "which": which,
                    "sync": None if ddp is None else bool(ddp.require_backward_grad_sync),
                    "allreduce_calls": self.comm_calls - before,
                    "grad": flat_grad(params).clone(),
                })

        def _clip(self, opt: Any) -> None:
            if self.clip is not None:
                params = [p for g in opt.param_groups for p in g["params"]]
                before = flat_grad(params).norm().item()
                self.clip_gradients(opt, gradient_clip_val=self.clip, gradient_clip_algorithm="norm")
                self.records.append({"which": "clip", "before": before, "after": flat_grad(params).norm().item()})

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            # called by the optimizer's step(), i.e. at the block's exit: after clip_gradients in the block
            if self.clip is not None:
                params = [p for g in optimizer.param_groups for p in g["params"]]
                which = "d" if params[0] is next(self.discriminator.parameters()) else "g"
                self.records.append({"which": "step", "opt": which, "norm": flat_grad(params).norm().item()})

        # -- the training step, three spellings --

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, z = batch
            g_opt, d_opt = self.optimizers()
            k = self.accumulate
            first, last = batch_idx % k == 0, (batch_idx + 1) % k == 0
            if self.explode_at == batch_idx:
                self._explode(d_opt)
            if self.style == "manual":
                d_loss, g_loss = self._manual(x, z, g_opt, d_opt, first, last, batch_idx)
            else:
                if self.style == "block":
                    d_block = self.toggle_optimizer(d_opt, zero_grad=first, step=last, sync_grad=last)
                else:
                    d_block = toggleshim.toggle(self, d_opt, zero_grad=first, step=last, sync_grad=last)
                with d_block:
                    d_loss = self.d_loss(x, z) / k
                    self._backward(d_loss, "d", batch_idx, d_opt)
                    if last:
                        self._clip(d_opt)
                if self.style == "block":
                    g_block = self.toggle_optimizer(g_opt, zero_grad=first, step=last, sync_grad=last)
                else:
                    g_block = toggleshim.toggle(self, g_opt, zero_grad=first, step=last, sync_grad=last)
                with g_block:
                    g_loss = self.g_loss(z) / k
                    self._backward(g_loss, "g", batch_idx, g_opt)
            # values computed inside the blocks, logged after them
            self.log("d_loss", d_loss.detach(), prog_bar=True)
            self.log("g_loss", g_loss.detach(), prog_bar=True)
            self.last = {"d_loss": d_loss.item(), "g_loss": g_loss.item()}
            if self.schedulers and last:
                for sched in self.lr_schedulers():
                    sched.step()

        def _manual(self, x: torch.Tensor, z: torch.Tensor, g_opt: Any, d_opt: Any, first: bool, last: bool,
                    batch_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
            k = self.accumulate
            if k == 1:  # Lightning's documented sequence
                self.toggle_optimizer(d_opt)
                d_opt.zero_grad()
                d_loss = self.d_loss(x, z)
                self._backward(d_loss, "d", batch_idx, d_opt)
                self._clip(d_opt)
                d_opt.step()
                self.untoggle_optimizer(d_opt)

                self.toggle_optimizer(g_opt)
                g_opt.zero_grad()
                g_loss = self.g_loss(z)
                self._backward(g_loss, "g", batch_idx, g_opt)
                g_opt.step()
                self.untoggle_optimizer(g_opt)
                return d_loss, g_loss
            # accumulation: Lightning's toggle_model(sync_grad=...) recipe
            with d_opt.toggle_model(sync_grad=last):
                if first:
                    d_opt.zero_grad()
                d_loss = self.d_loss(x, z) / k
                self._backward(d_loss, "d", batch_idx, d_opt)
                if last:
                    self._clip(d_opt)
                    d_opt.step()
            with g_opt.toggle_model(sync_grad=last):
                if first:
                    g_opt.zero_grad()
                g_loss = self.g_loss(z) / k
                self._backward(g_loss, "g", batch_idx, g_opt)
                if last:
                    g_opt.step()
            return d_loss, g_loss

        def _explode(self, d_opt: Any) -> None:
            """Raise inside a ``sync_grad=False`` block (after a forward), catch it, record the aftermath."""
            ddp = self._ddp()
            inside = None
            try:
                with self.toggle_optimizer(d_opt, zero_grad=False, step=False, sync_grad=False):
                    inside = None if ddp is None else bool(ddp.require_backward_grad_sync)
                    self.generator(torch.zeros(1, LATENT)).sum()
                    raise KeyError("boom")
            except KeyError:
                pass
            self.records.append({
                "which": "explode",
                "sync_inside": inside,
                "sync_after": None if ddp is None else bool(ddp.require_backward_grad_sync),
                "requires_grad_after": all(p.requires_grad for p in self.parameters()),
                "toggle_record_after": len(getattr(self, "_param_requires_grad_state", None) or {}),
            })

    return TinyGAN


def counting_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: the default all-reduce, counted on the LightningModule passed as ``state``.

    Unannotated on purpose: DDP rejects a ``bucket`` annotation that is not ``dist.GradBucket`` (and
    ``from __future__ import annotations`` turns every annotation into a string).
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.comm_calls += 1
    return default_hooks.allreduce_hook(dist.group.WORLD, bucket)


# -- closure optimizer -----------------------------------------------------------------------


def lbfgs_class(pl: Any) -> type:
    """Regression with two optimizers: SGD on a feature layer, LBFGS (closure) on the head."""

    class TwoStage(pl.LightningModule):
        def __init__(self, style: str = "block", seed: int = 0) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.style = style
            gen = torch.Generator().manual_seed(seed)
            self.features = mlp([2, 8], gen)
            self.head = mlp([8, 1], gen)
            self.closure_calls = 0

        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.features.parameters(), lr=0.05),
                    torch.optim.LBFGS(self.head.parameters(), lr=0.5, max_iter=4, history_size=4)]

        def loss(self, x: torch.Tensor) -> torch.Tensor:
            target = (x[:, :1] * x[:, 1:]).tanh()
            return nn.functional.mse_loss(self.head(torch.tanh(self.features(x))), target)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, _ = batch
            sgd, lbfgs = self.optimizers()

            def closure() -> torch.Tensor:
                # LBFGS re-evaluates: zero_grad, forward and backward belong in the closure
                self.closure_calls += 1
                lbfgs.zero_grad()
                loss = self.loss(x)
                self.manual_backward(loss)
                return loss

            if self.style == "manual":
                self.toggle_optimizer(sgd)
                sgd.zero_grad()
                f_loss = self.loss(x)
                self.manual_backward(f_loss)
                sgd.step()
                self.untoggle_optimizer(sgd)

                self.toggle_optimizer(lbfgs)
                h_loss = lbfgs.step(closure)
                self.untoggle_optimizer(lbfgs)
            else:
                with self.toggle_optimizer(sgd):
                    f_loss = self.loss(x)
                    self.manual_backward(f_loss)
                with self.toggle_optimizer(lbfgs, zero_grad=False, step=False) as opt:
                    h_loss = opt.step(closure)
            self.log("f_loss", f_loss.detach())
            self.log("h_loss", h_loss.detach())

    return TwoStage
