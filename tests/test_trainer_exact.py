"""Exactness under real ``Trainer.fit`` with manual optimization, for both flavours.

Each case trains the same world twice, once written with the block and once with Lightning's manual
sequence (``toggle; zero_grad; backward; step``, untoggle in ``finally``), over several batches, and
compares at every point: requires_grad, gradients, parameters, buffers, optimizer state and
``trainer.global_step``, bitwise (``toggleshim.testing.assert_toggle_equivalent_in_trainer``).
"""

from __future__ import annotations

import pytest

import toggleshim  # noqa: F401
from toggleshim.testing import (
    Backward,
    Block,
    GraphSpec,
    LayerSpec,
    OptimizerSpec,
    Raise,
    SetRequiresGrad,
    WorldSpec,
    assert_toggle_equivalent_in_trainer,
)

SGD_MOMENTUM = (("lr", 0.1), ("momentum", 0.9), ("weight_decay", 0.0))
ADAM = (("amsgrad", False), ("lr", 0.01), ("weight_decay", 0.0))
ADAMW = (("lr", 0.01), ("weight_decay", 0.01))
# Three linear heads: parameters 0,1 (head 0), 2,3 (head 1), 4,5 (head 2), plus a BatchNorm (6,7).
GRAPH = GraphSpec(
    (LayerSpec("linear", (3, 2)), LayerSpec("linear", (3, 2)), LayerSpec("linear", (3, 2)),
     LayerSpec("batchnorm", (2,))),
    seed=3,
)

CASES = {
    "two optimizers: SGD momentum and Adam": WorldSpec(
        GRAPH, (), (OptimizerSpec("sgd", (((0, 1), SGD_MOMENTUM),)), OptimizerSpec("adam", (((2, 3), ADAM),))),
        (Block(0, (Backward((0, 1)),)), Block(1, (Backward((1, 0)),))),
    ),
    "a parameter the user froze": WorldSpec(
        GRAPH, (1,), (OptimizerSpec("sgd", (((0, 1), SGD_MOMENTUM),)), OptimizerSpec("adam", (((2, 3), ADAM),))),
        (Block(0, (Backward((0,)),)), Block(1, (Backward((1,)),))),
    ),
    "three optimizers, param groups": WorldSpec(
        GRAPH, (),
        (OptimizerSpec("sgd", (((0,), SGD_MOMENTUM), ((1,), (("lr", 0.05), ("momentum", 0.0),
                                                               ("weight_decay", 0.01))))),
         OptimizerSpec("adam", (((2, 3), ADAM),)), OptimizerSpec("adamw", (((4, 5, 6, 7), ADAMW),))),
        (Block(0, (Backward((0, 2)),)), Block(1, (Backward((1,)),)), Block(2, (Backward((2, 3)),))),
    ),
    "a parameter shared by two optimizers": WorldSpec(
        GRAPH, (),
        (OptimizerSpec("sgd", (((0, 1, 2), SGD_MOMENTUM),)), OptimizerSpec("adam", (((2, 3), ADAM),))),
        (Block(0, (Backward((0, 1)),)), Block(1, (Backward((1,)),))),
    ),
    "exceptions, flags and user changes": WorldSpec(
        GRAPH, (),
        (OptimizerSpec("sgd", (((0, 1), SGD_MOMENTUM),)), OptimizerSpec("adam", (((2, 3), ADAM),))),
        (Block(0, (Backward((0,)), Raise())), Block(1, (SetRequiresGrad(3, False), Backward((1,)))),
         Block(1, (Backward((1,)),), zero_grad=False, step=False), Block(1, fail="step"),
         Block(0, (Raise("interrupt"),)), Block(0, (Backward((0,)),))),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_block_equals_manual_sequence_in_trainer_fit(flavour: str, case: str) -> None:
    run = assert_toggle_equivalent_in_trainer(CASES[case], flavour, batches=3)
    steps = [s.full["global_step"] for s in run.snapshots if s.full is not None]
    stepped = sum(1 for call in run.calls if call[0] == "step")
    failed_before_update = sum(1 for o in run.outcomes if o is not None and o[1].startswith("step of"))
    # global_step counts every LightningOptimizer step that ran, as in the manual sequence
    assert steps[-1] == stepped - failed_before_update > 0
