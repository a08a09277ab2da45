"""Train a module rendered by tests/_migrate_world.py in a real ``Trainer.fit``, with nothing of
toggleshim: this module imports torch and Lightning only, so that a process running it as a script
(``python tests/_migrate_plain.py SOURCES.json FLAVOUR OUT.pt``) never imports toggleshim, which it
checks before saving what it trained (the way back, ``migrate --to-lightning``, must leave code that
runs without it)."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import torch

BATCHES = 3

# One Trainer configuration for every rule: CPU, quiet, nothing written.
TRAINER: dict[str, Any] = dict(
    accelerator="cpu",
    devices=1,
    max_epochs=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)


def module_class(source: str) -> Any:
    namespace: dict[str, Any] = {"BATCHES": BATCHES, "__name__": "migrate_world"}
    exec(compile(source, "<training_step>", "exec"), namespace)
    return namespace["Module"]


def world(module: Any, optimizers: list[Any], global_step: int) -> dict[str, Any]:
    """What training left: parameters, gradients (None too), requires_grad, optimizer state, what
    ``observe()`` saw, the global step."""
    return {
        "params": [p.detach().clone() for p in module.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in module.parameters()],
        "requires_grad": [p.requires_grad for p in module.parameters()],
        "optimizers": [o.state_dict() for o in optimizers],
        "trace": module.trace,
        "global_step": global_step,
    }


def fit_plain(source: str, flavour: str) -> dict[str, Any]:
    """Train the module of ``source`` in a real Trainer.fit of ``flavour`` (seeded); the world after."""
    pl = importlib.import_module(flavour)
    torch.manual_seed(0)
    module = module_class(source)()
    trainer = pl.Trainer(**TRAINER)
    trainer.fit(module)
    return world(module, list(trainer.optimizers), int(trainer.global_step))


def main(argv: list[str]) -> int:
    sources_path, flavour, out = argv
    with open(sources_path) as fh:
        sources = json.load(fh)
    worlds = [fit_plain(source, flavour) for source in sources]
    imported = sorted(name for name in sys.modules if name.split(".")[0] == "toggleshim")
    if imported:
        sys.stderr.write(f"toggleshim was imported: {', '.join(imported)}\n")
        return 3
    torch.save(worlds, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
