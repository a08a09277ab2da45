"""The opt-in assumptions of the forward rewrite (``--assume NAME``, off by default; docs/migrate.md,
"Assumptions"): each lets the user vouch for what the tool cannot see."""

from __future__ import annotations

# Opt-in assumptions (``--assume NAME``, off by default; docs/migrate.md, "Assumptions")
ASSUMPTIONS = {
    "torch2-defaults": "optimizers keep torch >= 2.0 defaults: `X.zero_grad(set_to_none=True)` is the block's "
    "`X.zero_grad()`",
    "forward-reads-no-grad": "the code between the toggle and `X.zero_grad()` reads and writes no gradient "
    "(through what it calls, too), and if it raises, X's gradients are not needed: `zero_grad()` may move above it",
}
