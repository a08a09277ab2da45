"""The block equals the manual sequence (differential) and the documented semantics (model).

Stand-in trainer worlds here (fast); ``test_trainer.py`` repeats the differential check inside real
``Trainer.fit`` runs.
"""

from __future__ import annotations

from hypothesis import example, given

import toggleshim  # noqa: F401  (installs the shim)
from toggleshim.testing import (
    Backward,
    Block,
    GraphSpec,
    LayerSpec,
    OptimizerSpec,
    Raise,
    SetRequiresGrad,
    Statement,
    WorldSpec,
    assert_toggle_equivalent,
    worlds,
)

_SGD = (("lr", 0.1), ("momentum", 0.9), ("weight_decay", 0.0))
_ADAM = (("amsgrad", False), ("lr", 0.01), ("weight_decay", 0.0))
# Two linear layers, weight+bias each: parameters 0..3; a shared parameter (1) in both optimizers.
_TWO = GraphSpec((LayerSpec("linear", (2, 2)), LayerSpec("linear", (2, 2))), seed=7)
_SHARED = (OptimizerSpec("sgd", (((0, 1), _SGD),)), OptimizerSpec("adam", (((1, 2, 3), _ADAM),)))


@given(worlds(nesting=False))
@example(WorldSpec(_TWO, (0,), _SHARED, (Block(1, (Backward((0, 1)),)), Block(0, (Backward((1,)),)))))
@example(WorldSpec(_TWO, (), _SHARED, (Block(0, (SetRequiresGrad(1, False), Backward((0,)))),)))
@example(WorldSpec(_TWO, (), _SHARED, (Block(1, (Backward((1,)), Raise("interrupt"))), Block(1, fail="step"))))
@example(WorldSpec(_TWO, (), _SHARED, (Statement(0, (Block(1, (Backward((1,)),)),)),)))
def test_flat_programs_equal_manual_sequence_and_model(flavour: str, spec: WorldSpec) -> None:
    assert_toggle_equivalent(spec, flavour)


@given(worlds(nesting=True))
@example(WorldSpec(_TWO, (), _SHARED, (Block(0, (Block(1, (Backward((1,)),)), Backward((0,)))),)))
@example(WorldSpec(_TWO, (), _SHARED, (Block(0, (Statement(1, (Raise(),)),)), Block(1, (Backward((1,)),)))))
def test_nested_programs_follow_the_model(flavour: str, spec: WorldSpec) -> None:
    assert_toggle_equivalent(spec, flavour)
