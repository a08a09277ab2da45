"""Two-process CPU DDP (gloo) runs for ``test_training.py``: ``python tests/_ddp_script.py OUT_DIR FLAVOUR...``.

Why a script: Lightning's ``strategy="ddp"`` starts rank 1 by re-running the command line of rank 0,
which under pytest would re-run the test session. So the test runs this script in a subprocess; every
rank runs the same fits in the same order (one process group serves all of them, both flavours) and
saves, per fit, ``OUT_DIR/<flavour>/<fit>_rank<r>.pt`` (state_dict, probe records, step count).

Fits, per flavour:

* ``gan_block`` / ``gan_manual``: the GAN with toggleshim's block, and with Lightning's own
  toggle; zero_grad; backward; step; untoggle (toggleshim uninstalled).
* ``acc_block`` / ``acc_manual``: gradient accumulation over ``ACCUMULATE`` micro-batches, gradient
  sync only on the last; the manual one is Lightning's ``opt.toggle_model(sync_grad=...)`` recipe.
* ``explode``: an exception raised inside a ``sync_grad=False`` block and caught in ``training_step``.
* ``plain_ddp``: ``find_unused_parameters=False``, expected to fail; the error message is saved.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _training_models as M

import toggleshim  # noqa: F401  (patches both flavours)

BATCH = 8  # per rank
BATCHES = 6  # per rank and epoch
ACCUMULATE = 3
EXPLODE_AT = 1  # the batch whose sync_grad=False block raises


def _trainer(pl: Any, find_unused: bool = True) -> Any:
    # Toggling freezes the other optimizer's parameters, so each backward leaves some parameters without
    # a gradient; DDP's reducer must be told to look for them (find_unused_parameters=True).
    strategy = pl.strategies.DDPStrategy(find_unused_parameters=find_unused, process_group_backend="gloo")
    return pl.Trainer(devices=2, strategy=strategy, max_epochs=1, deterministic=True, **M.TRAINER_DEFAULTS)


def _data() -> Any:
    return M.loader(2 * BATCH * BATCHES, BATCH)


def fit(pl: Any, out: Path, name: str, style: str, **kwargs: Any) -> None:
    model = M.gan_class(pl)(style=style, probe=True, **kwargs)
    trainer = _trainer(pl)
    if style == "manual":
        with M.lightning_original():
            trainer.fit(model, _data())
    else:
        trainer.fit(model, _data())
    torch.save(
        {
            "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "records": model.records,
            "global_step": trainer.global_step,
            "world_size": trainer.world_size,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        },
        out / f"{name}_rank{trainer.global_rank}.pt",
    )


def fit_plain_ddp(pl: Any, out: Path) -> None:
    """``strategy="ddp"`` (no unused-parameter detection) with the block: record how it fails."""
    model = M.gan_class(pl)(style="block")
    trainer = _trainer(pl, find_unused=False)
    error = None
    try:
        trainer.fit(model, _data())
    except RuntimeError as exc:  # raised on both ranks alike, before any all-reduce
        error = str(exc)
    torch.save({"error": error, "global_step": trainer.global_step},
               out / f"plain_ddp_rank{trainer.global_rank}.pt")


def main() -> None:
    root = Path(sys.argv[1])
    for flavour in sys.argv[2:]:
        pl = M.flavour_module(flavour)
        out = root / flavour
        out.mkdir(parents=True, exist_ok=True)
        fit(pl, out, "gan_block", "block")
        fit(pl, out, "gan_manual", "manual")
        fit(pl, out, "acc_block", "block", accumulate=ACCUMULATE)
        fit(pl, out, "acc_manual", "manual", accumulate=ACCUMULATE)
        fit(pl, out, "explode", "block", explode_at=EXPLODE_AT)
        fit_plain_ddp(pl, out)
    print(f"rank {os.environ.get('LOCAL_RANK', '0')} done", flush=True)


if __name__ == "__main__":
    main()
