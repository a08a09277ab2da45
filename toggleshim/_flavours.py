"""The Lightning flavours toggleshim knows, written once (package, CLI, pytest plugin, harness, scripts).
Imports no torch, no Lightning. A third flavour is one more :class:`Flavour` in :data:`FLAVOURS`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FLAVOURS", "NAMES", "Flavour", "by_name", "of_module"]


@dataclass(frozen=True)
class Flavour:
    """One way Lightning is installed: the package that holds ``LightningModule``."""

    name: str  # import name of the package: what users write, `--flavour`, TOGGLESHIM_FLAVOUR
    distribution: str  # its distribution (importlib.metadata), as pip names it
    fabric: str  # the Fabric package it runs on (its loggers print the banners the CLI silences)
    reexports: tuple[str, ...] = ()  # other packages re-exporting its LightningModule (`import lightning as L`)

    @property
    def core_module(self) -> str:
        """Where ``LightningModule`` and its toggle code live."""
        return f"{self.name}.core.module"

    @property
    def optimizer_module(self) -> str:
        """Where ``LightningOptimizer`` lives."""
        return f"{self.name}.core.optimizer"

    @property
    def trainer_module(self) -> str:
        """Where ``Trainer`` lives (toggleshim hands it to spawned processes: ``_spawn.py``)."""
        return f"{self.name}.trainer.trainer"

    @property
    def top(self) -> str:
        """The top-level package a ``LightningModule`` subclass's module name starts with."""
        return self.name.split(".")[0]


FLAVOURS = (
    Flavour("lightning.pytorch", "lightning", "lightning.fabric", reexports=("lightning",)),
    Flavour("pytorch_lightning", "pytorch-lightning", "lightning_fabric"),
)
NAMES = tuple(f.name for f in FLAVOURS)


def by_name(name: str) -> Flavour:
    for flavour in FLAVOURS:
        if flavour.name == name:
            return flavour
    raise ValueError(f"unknown Lightning flavour {name!r}; known: {', '.join(NAMES)}")


def of_module(module_name: str) -> Flavour | None:
    """The flavour a module (``cls.__module__``) belongs to, by its top-level package, or None."""
    top = module_name.split(".")[0]
    return next((f for f in FLAVOURS if f.top == top), None)
