"""The block equals the manual sequence (differential) and the documented semantics (model).

Stand-in trainer worlds here (fast); ``test_trainer.py`` repeats the differential check inside real
``Trainer.fit`` runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hypothesis import example, given
from hypothesis import strategies as st

import toggleshim  # noqa: F401  (installs the shim)
from toggleshim.testing import (
    FLAT_EXAMPLES,
    NESTED_EXAMPLES,
    USER_CLASS_EXAMPLES,
    Backward,
    Block,
    EditRecord,
    Statement,
    WorldSpec,
    assert_toggle_equivalent,
    worlds,
)
from toggleshim.testing.specs import Untoggle


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


@given(spec=worlds(nesting=False, user_class=True))
@_examples(tuple(s for s in USER_CLASS_EXAMPLES if not s.nested))
def test_user_classes_flat_programs_equal_manual_sequence_with_their_methods(flavour: str, spec: WorldSpec) -> None:
    """The module's class overrides toggle/untoggle_optimizer (drawn): the block is the manual sequence
    written with the module's own methods, bitwise, and the model with the overrides at every point."""
    assert_toggle_equivalent(spec, flavour)


@given(spec=worlds(nesting=True, user_class=True))
@_examples(tuple(s for s in USER_CLASS_EXAMPLES if s.nested))
def test_user_classes_nested_programs_follow_the_model(flavour: str, spec: WorldSpec) -> None:
    assert_toggle_equivalent(spec, flavour)


@st.composite
def _rare_shapes(draw: st.DrawFn) -> WorldSpec:
    """Worlds whose program is a shape the random programs reach only now and then, each inside a
    block over optimizer ``j``: a statement toggle over ``k`` untoggled through the other object
    (``k`` passed as a ``LightningOptimizer``, the untoggle given the torch optimizer inside it); a stray
    untoggle of any optimizer ``m`` (often another) while that statement toggle is open; the record's
    entries deleted, the last one included (the record then holds a prefix of what was toggled)."""
    spec = draw(worlds(nesting=False, faults=False, hostile=False, max_ops=1))
    n = len(spec.optimizers)
    j, k, m = (draw(st.integers(0, n - 1), label=label) for label in ("block", "statement", "stray untoggle"))
    backward = Backward(tuple(range(len(spec.graph.layers) + len(spec.graph.loose))))
    shape = draw(st.sampled_from(["other object", "stray untoggle", "record entry deleted"]), label="shape")
    if shape == "other object":
        body: tuple[object, ...] = (Statement(k, (backward,), other=True), backward)
        spec = dataclasses.replace(spec, wrapped=tuple(sorted({*spec.wrapped, k})))
    elif shape == "stray untoggle":
        body = (Statement(k, (Untoggle(m), backward), other=draw(st.booleans(), label="other object")),)
    else:
        entries = draw(st.lists(st.integers(0, 11), min_size=1, max_size=3), label="entries deleted")
        body = tuple(EditRecord(e, "delete") for e in entries)
    return dataclasses.replace(spec, program=(Block(j, body, zero_grad=False, step=False),))


@given(spec=_rare_shapes())
def test_rare_shapes_follow_the_model(flavour: str, spec: WorldSpec) -> None:
    assert_toggle_equivalent(spec, flavour)
