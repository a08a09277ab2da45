"""Every rule of ``toggleshim migrate`` (docs/migrate.md), proven in a real ``Trainer.fit``.

Each case is a ``training_step`` written with statement toggles. The test migrates the module's
source, checks that the rule fired as expected (the ``with`` line it must produce), then trains the
original on Lightning's own methods and the migrated module on the patch (CPU, manual optimization,
two optimizers sharing a parameter, three batches, fixed seed) and compares bitwise: parameters,
optimizer state, ``.grad`` with None-ness, ``requires_grad``, ``global_step``, and what ``observe()``
saw inside the step.
"""

from __future__ import annotations

import pytest
from _migrate_world import assert_same_world, fit, migrated, render

# rule -> (statement-style body, the `with` line(s) the migration must produce)
RULES: dict[str, tuple[str, list[str]]] = {
    "canonical: zero_grad first, step last (both taken over)": (
        """
        self.toggle_optimizer(d_opt)
        d_opt.zero_grad()
        self.manual_backward(self.loss(x, 1))
        d_opt.step()
        self.untoggle_optimizer(d_opt)
        self.toggle_optimizer(g_opt)
        g_opt.zero_grad()
        self.manual_backward(self.loss(x, 0))
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(d_opt):", "with self.toggle_optimizer(g_opt):"],
    ),
    "inert lines before zero_grad and after step": (
        """
        self.toggle_optimizer(g_opt)
        tag = 1
        g_opt.zero_grad()
        self.manual_backward(self.loss(x, 0))
        g_opt.step()
        done = True
        self.untoggle_optimizer(g_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(g_opt):"],
    ),
    "loss computed before zero_grad: zero_grad kept": (
        """
        self.toggle_optimizer(g_opt)
        loss = self.loss(x, 0)
        self.observe()
        g_opt.zero_grad()
        self.manual_backward(loss)
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        """,
        ["with self.toggle_optimizer(g_opt, zero_grad=False):"],
    ),
    "statements after step: step kept": (
        """
        self.toggle_optimizer(d_opt)
        d_opt.zero_grad()
        self.manual_backward(self.loss(x, 1))
        d_opt.step()
        self.observe()
        self.untoggle_optimizer(d_opt)
        """,
        ["with self.toggle_optimizer(d_opt, step=False):"],
    ),
    "zero_grad after step (grads left to the next toggle)": (
        """
        self.toggle_optimizer(g_opt)
        self.manual_backward(self.loss(x, 0))
        g_opt.step()
        g_opt.zero_grad()
        self.untoggle_optimizer(g_opt)
        self.observe()
        self.toggle_optimizer(d_opt)
        self.manual_backward(self.loss(x, 1))
        d_opt.step()
        self.untoggle_optimizer(d_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(g_opt, zero_grad=False, step=False):",
         "with self.toggle_optimizer(d_opt, zero_grad=False):"],
    ),
    "accumulation: conditional zero_grad and step stay in the body": (
        """
        self.toggle_optimizer(g_opt)
        if batch_idx % 2 == 0:
            g_opt.zero_grad()
        self.manual_backward(self.loss(x, 0) / 2)
        if batch_idx % 2 == 1:
            g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(g_opt, zero_grad=False, step=False):"],
    ),
    "spellings: an index, an attribute; zero_grad through another spelling is kept": (
        """
        self.d = d_opt
        self.toggle_optimizer(opts[0])
        opts[0].zero_grad()
        self.manual_backward(self.loss(x, 0))
        opts[0].step()
        self.untoggle_optimizer(opts[0])
        self.toggle_optimizer(self.d)
        d_opt.zero_grad()
        self.manual_backward(self.loss(x, 1))
        self.d.step()
        self.untoggle_optimizer(self.d)
        self.observe()
        """,
        ["with self.toggle_optimizer(opts[0]):", "with self.toggle_optimizer(self.d, zero_grad=False):"],
    ),
    "clip_gradients and retain_graph inside the span": (
        """
        self.toggle_optimizer(d_opt)
        d_opt.zero_grad()
        loss = self.loss(x, 1)
        self.manual_backward(loss, retain_graph=True)
        self.manual_backward(loss)
        self.clip_gradients(d_opt, gradient_clip_val=0.01, gradient_clip_algorithm="norm")
        d_opt.step()
        self.untoggle_optimizer(d_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(d_opt):"],
    ),
    "zero_grad before the toggle, nothing to take over; a user change to requires_grad": (
        """
        g_opt.zero_grad()
        self.toggle_optimizer(g_opt)
        self.a.bias.requires_grad_(batch_idx % 2 == 0)
        self.manual_backward(self.loss(x, 0))
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(g_opt, zero_grad=False):"],
    ),
    "an empty block: zero_grad then step": (
        """
        self.manual_backward(self.loss(x, 0))
        self.toggle_optimizer(g_opt)
        g_opt.zero_grad()
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(g_opt):"],
    ),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_migrated_module_trains_bit_identically_in_trainer_fit(flavour: str, rule: str) -> None:
    body, expected = RULES[rule]
    original = render(body, flavour)
    new = migrated(original)
    with_lines = [line.strip() for line in new.splitlines() if line.strip().startswith("with self.toggle")]
    assert with_lines == expected
    code = [line.split("#")[0].strip() for line in new.splitlines()]
    assert not [c for c in code if c.startswith(("self.toggle_optimizer", "self.untoggle_optimizer"))]
    before = fit(original, patched=False, flavour=flavour)
    after = fit(new, patched=True, flavour=flavour)
    assert after["global_step"] > 0 and after["trace"], "the step ran"
    assert_same_world(before, after)


def test_comparison_detects_a_wrong_rewrite() -> None:
    """The comparison is not blind: a rewrite with the wrong flag (zero_grad taken over although the
    loss's backward ran before it) trains differently."""
    original = render(
        """
        self.toggle_optimizer(g_opt)
        self.manual_backward(self.loss(x, 0))
        g_opt.zero_grad()
        self.manual_backward(self.loss(x, 0) * 2)
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        """
    )
    right = migrated(original)
    assert "with self.toggle_optimizer(g_opt, zero_grad=False):" in right
    # the naive rewrite: zero_grad moved to the entry, before the first backward (its gradients then stay)
    wrong = right.replace("zero_grad=False", "zero_grad=True").replace("g_opt.zero_grad()\n", "pass\n")
    assert wrong.count("pass\n") == right.count("pass\n") + 1
    before = fit(original, patched=False)
    assert_same_world(before, fit(right, patched=True))
    with pytest.raises(AssertionError):
        assert_same_world(before, fit(wrong, patched=True))


# Opt-in assumptions (docs/migrate.md, "Assumptions"): (assumed, body, the `with` line(s) without the
# assumption, with it). Each case keeps the assumption, and trains bitwise the same migrated with it.
ASSUMED: dict[str, tuple[str, str, list[str], list[str]]] = {
    "torch2-defaults: zero_grad(set_to_none=True) is the block's zero_grad()": (
        "torch2-defaults",
        """
        self.toggle_optimizer(d_opt)
        d_opt.zero_grad(set_to_none=True)
        self.manual_backward(self.loss(x, 1))
        d_opt.step()
        self.untoggle_optimizer(d_opt)
        self.observe()
        self.toggle_optimizer(g_opt)
        g_opt.zero_grad(set_to_none=True)
        self.manual_backward(self.loss(x, 0))
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(d_opt, zero_grad=False):", "with self.toggle_optimizer(g_opt, zero_grad=False):"],
        ["with self.toggle_optimizer(d_opt):", "with self.toggle_optimizer(g_opt):"],
    ),
    "forward-reads-no-grad: the loss computed before zero_grad()": (
        "forward-reads-no-grad",
        """
        self.toggle_optimizer(g_opt)
        loss = self.loss(x, 0)
        scaled = loss * (batch_idx + 1)
        g_opt.zero_grad()
        self.manual_backward(scaled)
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.observe()
        self.toggle_optimizer(d_opt)
        with torch.no_grad():
            target = self.a(x).detach()
        d_opt.zero_grad()
        self.manual_backward(((self.b(x) - target) ** 2).sum())
        d_opt.step()
        self.untoggle_optimizer(d_opt)
        self.observe()
        """,
        ["with self.toggle_optimizer(g_opt, zero_grad=False):", "with self.toggle_optimizer(d_opt, zero_grad=False):"],
        ["with self.toggle_optimizer(g_opt):", "with self.toggle_optimizer(d_opt):"],
    ),
}


@pytest.mark.parametrize("case", list(ASSUMED))
def test_assumption_kept_trains_bit_identically_in_trainer_fit(flavour: str, case: str) -> None:
    assumed, body, default, clean = ASSUMED[case]
    original = render(body, flavour)
    for assume, expected in ((frozenset(), default), (frozenset({assumed}), clean)):
        new = migrated(original, assume)
        assert [line.strip() for line in new.splitlines() if line.strip().startswith("with self.")] == expected
    before = fit(original, patched=False, flavour=flavour)
    after = fit(new, patched=True, flavour=flavour)
    assert after["global_step"] > 0 and after["trace"], "the step ran"
    assert_same_world(before, after)


def test_assumption_broken_trains_differently() -> None:
    """Why forward-reads-no-grad is opt-in: code before zero_grad() that reads gradients through a
    call the tool cannot see into (``observe()`` records every ``.grad``) sees them cleared once
    zero_grad() moves above it. (A visible backward before zero_grad() keeps it in place even then.)"""
    original = render(
        """
        self.toggle_optimizer(g_opt)
        self.observe()
        g_opt.zero_grad()
        self.manual_backward(self.loss(x, 0))
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        """
    )
    broken = migrated(original, frozenset({"forward-reads-no-grad"}))
    assert "with self.toggle_optimizer(g_opt):" in broken
    before = fit(original, patched=False)
    assert_same_world(before, fit(migrated(original), patched=True))  # the default rules: exact
    with pytest.raises(AssertionError):
        assert_same_world(before, fit(broken, patched=True))


BOTH = """
self.toggle_optimizer(g_opt)
loss = self.loss(x, 0)
g_opt.zero_grad(set_to_none=True)
self.manual_backward(loss)
g_opt.step()
self.untoggle_optimizer(g_opt)
self.observe()
self.toggle_optimizer(d_opt)
scaled = self.loss(x, 1) * (batch_idx + 1)
d_opt.zero_grad(set_to_none=True)
self.manual_backward(scaled)
d_opt.step()
self.untoggle_optimizer(d_opt)
self.observe()
"""


@pytest.mark.one_flavour_by_default
def test_both_assumptions_together_train_bit_identically_in_trainer_fit(flavour: str) -> None:
    """`--assume torch2-defaults --assume forward-reads-no-grad`: the loss computed before
    `zero_grad(set_to_none=True)` needs both to reach the plain block (either alone keeps
    `zero_grad=False`), and the module migrated with both trains bitwise as the original."""
    original = render(BOTH, flavour)
    kept = [f"with self.toggle_optimizer({o}, zero_grad=False):" for o in ("g_opt", "d_opt")]
    for assume, expected in (
        (frozenset(), kept),
        (frozenset({"torch2-defaults"}), kept),
        (frozenset({"forward-reads-no-grad"}), kept),
        (frozenset({"torch2-defaults", "forward-reads-no-grad"}),
         ["with self.toggle_optimizer(g_opt):", "with self.toggle_optimizer(d_opt):"]),
    ):
        new = migrated(original, assume)
        assert [line.strip() for line in new.splitlines() if line.strip().startswith("with self.")] == expected
    assert "_opt.zero_grad(" not in new  # both calls taken over by the blocks
    before = fit(original, patched=False, flavour=flavour)
    after = fit(new, patched=True, flavour=flavour)
    assert after["global_step"] > 0 and after["trace"], "the step ran"
    assert_same_world(before, after)
