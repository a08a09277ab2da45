"""Inside real ``Trainer.fit`` runs: the block through ``LightningOptimizer`` equals the manual sequence.

Each example is two full fits, so this property draws fewer examples than the stand-in ones.
"""

from __future__ import annotations

from hypothesis import given, settings

import toggleshim  # noqa: F401
from toggleshim.testing import WorldSpec, assert_toggle_equivalent_in_trainer, worlds


@settings(max_examples=max(3, settings.default.max_examples // 10))  # ~0.5 s an example: a tenth
@given(worlds(nesting=False, max_ops=3))
def test_trainer_programs_equal_manual_sequence(flavour: str, spec: WorldSpec) -> None:
    assert_toggle_equivalent_in_trainer(spec, flavour)
