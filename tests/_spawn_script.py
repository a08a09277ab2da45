"""Two-process CPU ``ddp_spawn`` runs for ``test_spawn_amp.py``: ``python tests/_spawn_script.py OUT_DIR FLAVOUR...``.

Why a script: ``strategy="ddp_spawn"`` starts each rank with multiprocessing's ``spawn``, which
re-imports the main module as ``__mp_main__`` (its top-level code only) and unpickles the Trainer and
the LightningModule sent by the parent. Run as users run it: a fresh process whose main module
defines the module class, so the children find it by name.

Per flavour, the GAN of ``_training_models.py`` trains twice: ``block`` (toggleshim's ``with``) and
``manual`` (Lightning's toggle; zero_grad; backward; step; untoggle, with toggleshim uninstalled in
every rank). Each rank saves ``OUT_DIR/<flavour>/<style>_rank<r>.pt`` at the end of training; the
parent saves what it holds after ``fit`` returns (rank 0's weights, sent back by Lightning) as
``<style>_parent.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _training_models as M

# At the top level of the module that defines the LightningModule: every spawned rank runs it
# (as ``__mp_main__``), so every rank trains with toggleshim installed.
import toggleshim
from toggleshim.testing import installed_flavours

BATCH = 8  # per rank
BATCHES = 4  # per rank and epoch


def _spawnable(flavour: str, name: str) -> type:
    """The GAN on ``flavour``, named ``name`` in this module so that pickle finds it in the children."""

    class SpawnGAN(M.gan_class(M.flavour_module(flavour))):
        def __init__(self, style: str, out_dir: str) -> None:
            super().__init__(style=style)
            self.out_dir = out_dir
            self.installed_in_steps: set[bool] = set()

        def setup(self, stage: str) -> None:
            # In every rank, before training: the reference runs Lightning's own toggle methods. The
            # children imported toggleshim (above), so the parent's uninstall does not reach them.
            if self.style == "manual":
                toggleshim.uninstall()

        def teardown(self, stage: str) -> None:
            if self.style == "manual":
                toggleshim.install()

        def training_step(self, batch: Any, batch_idx: int) -> None:
            self.installed_in_steps.add(toggleshim.is_installed())
            super().training_step(batch, batch_idx)

        def on_train_end(self) -> None:
            trainer = self.trainer
            torch.save(
                {
                    "state": {k: v.detach().clone() for k, v in self.state_dict().items()},
                    "optimizers": [opt.state_dict() for opt in trainer.optimizers],
                    "requires_grad": [p.requires_grad for p in self.parameters()],
                    "global_step": trainer.global_step,
                    "world_size": trainer.world_size,
                    "global_rank": trainer.global_rank,
                    "installed_in_steps": sorted(self.installed_in_steps),
                },
                Path(self.out_dir) / f"{self.style}_rank{trainer.global_rank}.pt",
            )

    SpawnGAN.__name__ = SpawnGAN.__qualname__ = name
    return SpawnGAN


def class_name(flavour: str) -> str:
    return "GAN_" + flavour.replace(".", "_")


for _flavour in installed_flavours():
    globals()[class_name(_flavour)] = _spawnable(_flavour, class_name(_flavour))


def fit(flavour: str, out: Path, style: str) -> None:
    pl = M.flavour_module(flavour)
    model = globals()[class_name(flavour)](style, str(out))
    # Toggling freezes the other optimizer's parameters, so every backward leaves some without a
    # gradient: DDP must look for unused parameters.
    trainer = pl.Trainer(devices=2, strategy="ddp_spawn_find_unused_parameters_true", max_epochs=1,
                         deterministic=True, **M.TRAINER_DEFAULTS)
    data = M.loader(2 * BATCH * BATCHES, BATCH)
    if style == "manual":
        with M.lightning_original():
            trainer.fit(model, data)
    else:
        trainer.fit(model, data)
    torch.save({"state": {k: v.detach().clone() for k, v in model.state_dict().items()}},
               out / f"{style}_parent.pt")


def main() -> None:
    root = Path(sys.argv[1])
    for flavour in sys.argv[2:]:
        out = root / flavour
        out.mkdir(parents=True, exist_ok=True)
        fit(flavour, out, "block")
        fit(flavour, out, "manual")
    print("done", flush=True)


if __name__ == "__main__":
    main()
