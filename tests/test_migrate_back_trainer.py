"""``toggleshim migrate --to-lightning``, proven in a real ``Trainer.fit`` in a process that never
imports toggleshim (tests/_migrate_plain.py checks ``sys.modules`` before it reports).

The round trip: every module of tests/test_migrate_trainer.py (each forward rule, each assumption)
migrated forward and back trains bitwise as the statement-style original, both without toggleshim.
Blocks written by hand (every flag, ``as``, the ``toggleshim.toggle`` forms, a one-line block, a
return inside a block that does not step, an exception through a block) train without toggleshim,
back in Lightning's statements, bitwise as they do on toggleshim: parameters, optimizer state,
``.grad`` with None-ness, ``requires_grad``, ``global_step`` and what ``observe()`` saw. Comparisons
that compared nothing fail: a way back that kept ``import toggleshim``, and one that dropped a step.
"""

from __future__ import annotations

import pytest
from _migrate_world import assert_same_world, fit, fit_without_toggleshim, migrated, render, to_lightning
from test_migrate_trainer import ASSUMED, BOTH, RULES

from toggleshim.testing import installed_flavours

# -- the round trip: statements, blocks, statements ----------------------------------------------


def _round_trips(flavour: str) -> dict[str, tuple[str, str]]:
    """Each module of tests/test_migrate_trainer.py: (the original, migrated forward and back)."""
    cases = {rule: (body, frozenset[str]()) for rule, (body, _) in RULES.items()}
    cases |= {case: (body, frozenset({assumed})) for case, (assumed, body, _, _) in ASSUMED.items()}
    cases["both assumptions"] = (BOTH, frozenset({"torch2-defaults", "forward-reads-no-grad"}))
    trips = {}
    for case, (body, assume) in cases.items():
        original = render(body, flavour)
        there = migrated(original, assume)
        assert "with self.toggle_optimizer(" in there, case
        home = to_lightning(there)
        assert "toggleshim" not in home and "with self.toggle_optimizer" not in home, (case, home)
        trips[case] = (original, home)
    return trips


@pytest.mark.one_flavour_by_default
def test_forward_and_back_trains_bit_identically_without_toggleshim(flavour: str) -> None:
    trips = _round_trips(flavour)
    assert len(trips) == len(RULES) + len(ASSUMED) + 1
    worlds = fit_without_toggleshim([source for pair in trips.values() for source in pair], flavour)
    for n, case in enumerate(trips):
        original, home = worlds[2 * n], worlds[2 * n + 1]
        assert home["global_step"] > 0 and home["trace"], (case, "the step ran")
        assert_same_world(original, home, case)


# -- blocks written by hand: on toggleshim, and back in Lightning's statements without it --------

BLOCKS: dict[str, str] = {
    "every flag, both ways": """
        with self.toggle_optimizer(d_opt):
            self.manual_backward(self.loss(x, 1))
        self.observe()
        with self.toggle_optimizer(g_opt, zero_grad=False):
            self.manual_backward(self.loss(x, 0))
        self.observe()
        with self.toggle_optimizer(d_opt, step=False):
            self.manual_backward(self.loss(x, 1))
            d_opt.step()
            self.observe()
        with self.toggle_optimizer(g_opt, zero_grad=False, step=False, sync_grad=True):
            self.manual_backward(self.loss(x, 0))
        self.observe()
        """,
    "as, and a one-line block": """
        with self.toggle_optimizer(opts[0]) as opt:
            self.manual_backward(self.loss(x, 0))
            self.observe()
        with self.toggle_optimizer(opts[1], step=False): self.manual_backward(self.loss(x, 1))
        self.observe()
        """,
    "toggleshim.toggle and toggle": """
        with toggleshim.toggle(self, d_opt):
            self.manual_backward(self.loss(x, 1))
        self.observe()
        with toggle(self, g_opt, zero_grad=False):
            self.manual_backward(self.loss(x, 0))
        self.observe()
        """,
    "a return inside a block that does not step": """
        with self.toggle_optimizer(g_opt, step=False):
            self.manual_backward(self.loss(x, 0))
            if batch_idx == 1:
                self.observe()
                return
            g_opt.step()
        self.observe()
        """,
    "the README's accumulation recipe: every flag a name": """
        first, last = batch_idx % 2 == 0, batch_idx % 2 == 1
        with self.toggle_optimizer(d_opt, zero_grad=first, step=last, sync_grad=last):
            self.manual_backward(self.loss(x, 1))
        self.observe()
        with toggle(self, g_opt, zero_grad=last, step=first) as opt:
            self.manual_backward(self.loss(x, 0))
            self.observe()
        self.observe()
        """,
    "sync_grad=False, and flags from attributes": """
        self.stepping = batch_idx != 1
        with self.toggle_optimizer(d_opt, sync_grad=False, step=self.stepping):
            self.manual_backward(self.loss(x, 1))
        self.observe()
        with self.toggle_optimizer(g_opt, zero_grad=self.stepping, sync_grad=self.stepping):
            self.manual_backward(self.loss(x, 0))
        self.observe()
        """,
    "an exception through a block: no step, untoggled": """
        try:
            with self.toggle_optimizer(d_opt):
                self.manual_backward(self.loss(x, 1))
                if batch_idx == 1:
                    raise LookupError("through the block")
        except LookupError:
            self.observe()
        self.observe()
        """,
}
HEADER = "import toggleshim\nfrom toggleshim import toggle\n"


def _hand_written(case: str, flavour: str) -> tuple[str, str]:
    """(the module with blocks written by hand, on its way back)."""
    docstring, rest = render(BLOCKS[case], flavour).split("\n", 1)
    source = f"{docstring}\n{HEADER}{rest}"
    home = to_lightning(source)
    assert "toggleshim" not in home and "with self.toggle" not in home and "with toggle" not in home, home
    return source, home


@pytest.mark.one_flavour_by_default
def test_blocks_written_by_hand_train_bit_identically_without_toggleshim(flavour: str) -> None:
    pairs = {case: _hand_written(case, flavour) for case in BLOCKS}
    worlds = fit_without_toggleshim([home for _, home in pairs.values()], flavour)
    for (case, (source, _)), home in zip(pairs.items(), worlds):
        on_toggleshim = fit(source, patched=True, flavour=flavour)
        assert home["global_step"] > 0 and home["trace"], (case, "the step ran")
        assert_same_world(on_toggleshim, home, case)


# -- a check that checked nothing must fail -------------------------------------------------------


def test_the_process_without_toggleshim_fails_when_the_code_imports_it() -> None:
    """Had the way back kept ``import toggleshim``, the process would have imported it: it says so."""
    source, home = _hand_written("every flag, both ways", installed_flavours()[0])
    with pytest.raises(AssertionError, match="toggleshim was imported: toggleshim"):
        fit_without_toggleshim(["import toggleshim  # noqa: F401\n" + home])
    assert "import toggleshim" in source


def test_the_comparison_sees_a_way_back_that_drops_a_step() -> None:
    """A wrong way back (the step a block makes on exit left out) trains differently."""
    source, home = _hand_written("every flag, both ways", installed_flavours()[0])
    wrong = home.replace("            d_opt.step()\n", "            pass\n", 1)
    assert wrong != home
    right, broken = fit_without_toggleshim([home, wrong])
    on_toggleshim = fit(source, patched=True)
    assert_same_world(on_toggleshim, right)
    with pytest.raises(AssertionError):
        assert_same_world(on_toggleshim, broken)
