"""The block equals the manual sequence (differential) and the documented semantics (model).

Stand-in trainer worlds here (fast); ``test_trainer.py`` repeats the differential check inside real
``Trainer.fit`` runs.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import example, given

import toggleshim  # noqa: F401  (installs the shim)
from toggleshim.testing import FLAT_EXAMPLES, NESTED_EXAMPLES, WorldSpec, assert_toggle_equivalent, worlds


def _examples(specs: tuple[WorldSpec, ...]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def apply(test: Callable[..., None]) -> Callable[..., None]:
        for spec in specs:
            test = example(spec=spec)(test)
        return test

    return apply


@given(spec=worlds(nesting=False))
@_examples(FLAT_EXAMPLES)
def test_flat_programs_equal_manual_sequence_and_model(flavour: str, spec: WorldSpec) -> None:
    assert_toggle_equivalent(spec, flavour)


@given(spec=worlds(nesting=True))
@_examples(NESTED_EXAMPLES)
def test_nested_programs_follow_the_model(flavour: str, spec: WorldSpec) -> None:
    assert_toggle_equivalent(spec, flavour)
