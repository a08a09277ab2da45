"""Reusable test tools: the reference model, Hypothesis strategies and the equivalence checker.

    from hypothesis import given
    from toggleshim.testing import assert_toggle_equivalent, worlds

    @given(worlds())
    def test_toggling(spec):
        assert_toggle_equivalent(spec)

See README "Testing your own module" for running them against your own LightningModule, and
:func:`assert_trains_like_manual` for your own training code: your module fitted through toggleshim and
with every block expanded into Lightning's manual sequence, compared bitwise.
"""

from toggleshim.testing._checks import (
    assert_lightning_follows_model,
    assert_program_equivalent,
    assert_toggle_equivalent,
    assert_toggle_equivalent_in_trainer,
    compare_runs,
)
from toggleshim.testing._drivers import ManualDriver, ShimDriver
from toggleshim.testing._runner import run_program
from toggleshim.testing._worlds import InjectedFault, Mismatch, World, build_world, installed_flavours, user_world
from toggleshim.testing.model import ToggleModel, expected_calls, lightning_toggle, lightning_untoggle
from toggleshim.testing.report import trusting_unverified
from toggleshim.testing.specs import (
    FLAT_EXAMPLES,
    NESTED_EXAMPLES,
    USER_CLASS_EXAMPLES,
    Backward,
    BadFlag,
    Block,
    EditRecord,
    GraphSpec,
    LayerSpec,
    OptimizerSpec,
    Overrides,
    Raise,
    ReplaceRecord,
    SetRequiresGrad,
    Statement,
    Untoggle,
    WorldSpec,
    graphs,
    optimizer_partitions,
    programs,
    worlds,
)
from toggleshim.testing.trains import assert_trains_like_manual

__all__ = [
    "FLAT_EXAMPLES",
    "NESTED_EXAMPLES",
    "USER_CLASS_EXAMPLES",
    "Backward",
    "BadFlag",
    "Block",
    "EditRecord",
    "GraphSpec",
    "InjectedFault",
    "LayerSpec",
    "ManualDriver",
    "Mismatch",
    "OptimizerSpec",
    "Overrides",
    "Raise",
    "ReplaceRecord",
    "SetRequiresGrad",
    "ShimDriver",
    "Statement",
    "ToggleModel",
    "Untoggle",
    "World",
    "WorldSpec",
    "assert_lightning_follows_model",
    "assert_program_equivalent",
    "assert_toggle_equivalent",
    "assert_toggle_equivalent_in_trainer",
    "assert_trains_like_manual",
    "build_world",
    "compare_runs",
    "expected_calls",
    "graphs",
    "installed_flavours",
    "lightning_toggle",
    "lightning_untoggle",
    "optimizer_partitions",
    "programs",
    "run_program",
    "trusting_unverified",
    "user_world",
    "worlds",
]
