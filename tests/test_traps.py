"""Traps users met (issue 44, point 4), each under a real ``Trainer.fit`` with manual optimization.

A raw torch optimizer in a block (``self.optimizers(use_pl_optimizer=False)``, or an optimizer of the
user's own over registered parameters): Lightning counts no step of it, so ``trainer.global_step``
stays 0 and ``Trainer(max_steps=...)`` never ends; Lightning's own statements do the same. The block
says so once per optimizer, at the user's ``with`` line, and names what to pass; through the
``LightningOptimizer`` nothing is said and every step counts. A nested block over the same optimizer
that steps inside a block that steps: the error says a nested block stepped (not "your own step()").
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import toggleshim


def _fit(flavour: str, how: str, max_steps: int = -1) -> tuple[Any, Any, list[warnings.WarningMessage]]:
    """Fit a two-head module whose ``training_step`` runs one block per optimizer, the optimizers as
    ``how`` says: "raw" (``use_pl_optimizer=False``), "lightning" (``self.optimizers()``), "manual"
    (Lightning's own statements over the raw optimizers, no block). Returns the trainer, the module and
    the warnings."""
    pl = importlib.import_module(flavour)

    class TwoHeads(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.a, self.b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
            self.lines: list[int] = []

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            (x,) = batch
            opts = self.optimizers(use_pl_optimizer=how == "lightning")
            for opt, head in zip(opts, (self.a, self.b)):
                if how == "manual":
                    self.toggle_optimizer(opt)
                    opt.zero_grad()
                    self.manual_backward(head(x).pow(2).mean())
                    opt.step()
                    self.untoggle_optimizer(opt)
                    continue
                with self.toggle_optimizer(opt):  # the line a warning points at
                    self.manual_backward(head(x).pow(2).mean())

    torch.manual_seed(0)
    model = TwoHeads()
    trainer = pl.Trainer(max_epochs=1, max_steps=max_steps, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    data = DataLoader(TensorDataset(torch.randn(12, 2, generator=torch.Generator().manual_seed(1))), batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, data)
    return trainer, model, [w for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)]


_WITH_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                  if "the line a warning points at" in line)


@pytest.mark.one_flavour_by_default
def test_a_raw_optimizer_in_a_block_counts_no_step_as_in_lightning_and_is_warned_once_each(flavour: str) -> None:
    manual, _, none = _fit(flavour, "manual")
    assert manual.global_step == 0 and none == []  # Lightning's own statements: no step counted, no word
    trainer, _, caught = _fit(flavour, "raw")
    assert trainer.global_step == 0  # 3 batches, 2 blocks each, every one stepped: none counted
    assert len(caught) == 2, [str(w.message) for w in caught]  # once per optimizer, not per block
    for w in caught:
        text = str(w.message)
        assert "SGD directly, not through its LightningOptimizer" in text and "global_step" in text, text
        assert "max_steps" in text and "self.optimizers()" in text, text
        assert (w.filename, w.lineno) == (__file__, _WITH_LINE), (w.filename, w.lineno)


@pytest.mark.one_flavour_by_default
def test_the_lightning_optimizer_in_a_block_counts_every_step_without_a_word(flavour: str) -> None:
    trainer, _, caught = _fit(flavour, "lightning", max_steps=4)
    assert trainer.global_step == 4 and caught == []  # max_steps ends the fit: 2 batches, 2 steps each


# -- the double step's message -------------------------------------------------------------------


@pytest.mark.one_flavour_by_default
def test_a_nested_block_over_the_same_optimizer_is_named_as_the_second_step(flavour: str) -> None:
    """The inner block stepped at its exit: the outer's refusal says so (and which block to give
    step=False), never "your own step() call"; a step the body wrote keeps the message about it."""
    from _fixtures import state, three_heads

    m = three_heads(flavour)
    opt = m.opts[0]
    before = state(m)
    with pytest.raises(RuntimeError) as nested, m.toggle_optimizer(opt), m.toggle_optimizer(opt):
        m.a(torch.ones(1, 2)).sum().backward()
    assert "a nested `with self.toggle_optimizer(opt):` over the same SGD stepped it" in str(nested.value)
    assert "your own step()" not in str(nested.value) and "step=False to one of the two blocks" in str(nested.value)
    assert state(m) == before  # untoggled all the same
    with pytest.raises(RuntimeError) as own, m.toggle_optimizer(opt):
        m.a(torch.ones(1, 2)).sum().backward()
        opt.step()
    assert "Pass step=False to keep your own step() call" in str(own.value), own.value
    with m.toggle_optimizer(opt), m.toggle_optimizer(opt, step=False):  # one step, the outer's: fine
        m.a(torch.ones(1, 2)).sum().backward()
    assert state(m) == before
