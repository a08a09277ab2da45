"""Worlds: a module, its optimizers and a trainer, built from specs; the runner; the oracles.

A *world* is driven by a program either through the shim (``with module.toggle_optimizer(...)``,
exactly as users write it) or through the manual sequence with Lightning's original methods
(``toggle; zero_grad; body; step`` with ``untoggle`` in ``finally``). While it runs, the reference
model (:mod:`toggleshim.testing.model`) is advanced beside it and checked at every point; every point
is also recorded as a snapshot, so two worlds can be compared bitwise afterwards.

The code lives in four modules, bottom up: :mod:`~toggleshim.testing._worlds` (building worlds, the
stand-in trainer, the user's own module), :mod:`~toggleshim.testing._drivers` (the block through
toggleshim, and Lightning's manual sequence), :mod:`~toggleshim.testing._runner` (a program run with
the model checked at every point, also inside ``Trainer.fit``) and :mod:`~toggleshim.testing._checks`
(runs compared bitwise, and the assertions). This module is their one face: every name it had before
the split is importable from it as before.
"""

# Every name the harness had before the split is imported here, for `from toggleshim.testing.harness
# import X` (ruff: F401 is off for this file in pyproject.toml).

from __future__ import annotations

from typing import Any

from toggleshim._block import Toggle, toggle
from toggleshim._flavours import NAMES, of_module
from toggleshim._ours import MODE, original_of
from toggleshim.testing import _worlds
from toggleshim.testing import model as _model
from toggleshim.testing._checks import (
    _bitwise,
    _same,
    assert_lightning_follows_model,
    assert_program_equivalent,
    assert_toggle_equivalent,
    assert_toggle_equivalent_in_trainer,
    check_calls,
    compare_runs,
)
from toggleshim.testing._drivers import (
    ManualDriver,
    ShimDriver,
    _effective,
    _fallback,
    _inner,
    _kind,
    _says,
)
from toggleshim.testing._runner import (
    Run,
    Snapshot,
    _clone,
    _placed,
    _RecordLookalike,
    _Runner,
    run_in_trainer,
    run_program,
)
from toggleshim.testing._worlds import (
    _CONTAINERS,
    _GRAPH_CLASSES,
    _OPTIMIZERS,
    _TEMPLATES,
    InjectedFault,
    Mismatch,
    StandInStrategy,
    World,
    _build_optimizers,
    _flavour_module,
    _graph_terms,
    _inputs,
    _layer_term,
    _loose_term,
    _make_layer,
    _names,
    _new_layer,
    _optimizer_params,
    _ParamList,
    _stand_in_trainer,
    _SyncBlock,
    _wrap,
    build_graph,
    build_world,
    flavour_of,
    graph_module_class,
    installed_flavours,
    user_module_class,
    user_world,
)
from toggleshim.testing.report import bounded, compact_record
from toggleshim.testing.specs import (
    SYNC_FAULTS,
    Backward,
    BadFlag,
    Block,
    EditRecord,
    GraphSpec,
    OptimizerSpec,
    Overrides,
    Raise,
    ReplaceRecord,
    SetRequiresGrad,
    Statement,
    Untoggle,
    WorldSpec,
    _nested_in_block,
)

__all__ = [
    "InjectedFault",
    "Mismatch",
    "World",
    "assert_toggle_equivalent",
    "build_world",
    "compare_runs",
    "run_program",
]


def __getattr__(name: str) -> Any:
    """``WORLDS_BUILT``, read where it is counted (a copy bound here would stay 0)."""
    if name == "WORLDS_BUILT":
        return _worlds.WORLDS_BUILT
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
