"""The checks: two runs compared bitwise, a run against the model's calls, and the assertions built on them.

Re-exported by :mod:`toggleshim.testing.harness` and (the public ones) :mod:`toggleshim.testing`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from toggleshim._flavours import NAMES
from toggleshim.testing._drivers import ManualDriver, ShimDriver
from toggleshim.testing._runner import Run, run_in_trainer, run_program
from toggleshim.testing._worlds import Mismatch, World, _names, build_world, flavour_of
from toggleshim.testing.report import compact_record
from toggleshim.testing.specs import WorldSpec, _nested_in_block


def _bitwise(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return torch.equal(a, b)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _bitwise(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def compare_runs(a: Run, b: Run, world: World | None = None) -> None:
    """Raise :class:`Mismatch` at the first point where two runs differ (bitwise for tensors)."""
    names = _names(world) if world is not None else None

    def name(i: int) -> str:
        return f"`{names[i]}`" if names else f"#{i}"

    if a.outcomes != b.outcomes:
        raise Mismatch(f"the programs ended differently: {a.outcomes} vs {b.outcomes}")
    if a.calls != b.calls:
        raise Mismatch(f"optimizer calls differ: {a.calls} vs {b.calls}")
    if a.hooks != b.hooks:
        raise Mismatch(f"LightningOptimizer step hooks differ: {a.hooks} vs {b.hooks}")
    if a.override_log != b.override_log:
        raise Mismatch(f"the module's own toggle/untoggle_optimizer ran differently: {a.override_log} vs "
                       f"{b.override_log}")
    for sa, sb in zip(a.snapshots, b.snapshots):
        where = sa.where
        if sa.where != sb.where:
            raise Mismatch(f"the runs took different paths: {sa.where} vs {sb.where}")
        for i, (x, y) in enumerate(zip(sa.requires_grad, sb.requires_grad)):
            if x != y:
                raise Mismatch(
                    f"at {where}, parameter {name(i)} is {'trainable' if x else 'frozen'} in one "
                    f"world and {'trainable' if y else 'frozen'} in the other"
                )
        if sa.record != sb.record:
            raise Mismatch(f"at {where}, _param_requires_grad_state differs: {compact_record(sa.record, sb.record)} "
                           f"vs {compact_record(sb.record, sa.record)}")
        if sa.sync_blocked != sb.sync_blocked:
            raise Mismatch(f"at {where}, gradient sync is blocked in one world and not in the other")
        if sa.record_reads != sb.record_reads:
            raise Mismatch(f"at {where}, a replaced record was read otherwise than Lightning's untoggle reads it "
                           f"(lookups by parameter: {sa.record_reads} vs {sb.record_reads})")
        for i, (ga, gb) in enumerate(zip(sa.grads, sb.grads)):
            if not _bitwise(ga, gb):
                what = "None" if ga is None else "a tensor"
                other = "None" if gb is None else "a tensor"
                raise Mismatch(f"at {where}, the gradient of {name(i)} differs ({what} vs {other})")
        if (sa.full is None) != (sb.full is None):
            raise Mismatch(f"at {where}, the runs took different paths")
        if sa.full is not None and sb.full is not None:
            for key in ("params", "buffers", "state", "global_step"):
                if not _same(sa.full[key], sb.full[key]):
                    raise Mismatch(f"at {where}, {key} differ bitwise")
    if len(a.snapshots) != len(b.snapshots):
        raise Mismatch(f"the runs took different paths ({len(a.snapshots)} vs {len(b.snapshots)} points)")


def check_calls(run: Run, driver_name: str = "shim") -> None:
    """The model's expected optimizer calls (exit paths) against what the world received."""
    if run.calls != run.expected_calls:
        raise Mismatch(f"{driver_name} world: optimizer calls {run.calls}, the model expects {run.expected_calls}")
    if run.sync_log != run.expected_sync:
        raise Mismatch(
            f"{driver_name} world: the strategy's block_backward_sync was {run.sync_log}, the model expects "
            f"{run.expected_sync} (entered when a sync_grad=False block starts, left once when it ends)"
        )
    if run.hooks != run.expected_hooks:
        raise Mismatch(
            f"{driver_name} world: LightningOptimizer step hooks ran {run.hooks}, the model expects "
            f"{run.expected_hooks} (before/after around every step through a LightningOptimizer)"
        )


def assert_toggle_equivalent(spec: WorldSpec, flavour: str = NAMES[0]) -> None:
    """The shim world equals the model at every point; for flat programs, also Lightning's manual
    sequence, bitwise (requires_grad, gradients, parameters, buffers, optimizer state, exceptions)."""
    assert_program_equivalent(functools.partial(build_world, spec, flavour), spec.program, flavour)


def assert_toggle_equivalent_in_trainer(
    spec: WorldSpec, flavour: str = NAMES[0], batches: int = 1, **trainer_kwargs: Any
) -> Run:
    """:func:`assert_toggle_equivalent` inside two real ``Trainer.fit`` runs (flat programs only);
    returns the shim's run (its snapshots carry ``global_step``)."""
    if spec.nested:
        raise ValueError("the manual sequence has no nesting rule: pass a flat program")
    shim, world = run_in_trainer(spec, ShimDriver(), flavour, batches=batches, **trainer_kwargs)
    check_calls(shim)
    if shim.nested:  # a block inside a statement toggle left open by an exception: checked by the model
        return shim
    manual, _ = run_in_trainer(spec, ManualDriver.for_flavour(flavour), flavour, batches=batches, **trainer_kwargs)
    check_calls(manual, "manual")
    compare_runs(shim, manual, world)
    return shim


def assert_lightning_follows_model(spec: WorldSpec, flavour: str = NAMES[0]) -> None:
    """Lightning's *own* methods, driven by the manual sequence, against the model (flat programs).

    The regression guard for Lightning upgrades: the differential check cannot see a change that
    both worlds share, this one can.
    """
    if spec.nested:
        raise ValueError("the manual sequence has no nesting rule: pass a flat program")
    run = run_program(build_world(spec, flavour), spec.program, ManualDriver.for_flavour(flavour))
    check_calls(run, "manual")


def assert_program_equivalent(make_world: Callable[[], World], program: Sequence[object],
                              flavour: str | None = None) -> None:
    """Run ``program`` on two fresh worlds from ``make_world``: the shim against the model at every
    point, and (for flat programs) against Lightning's manual sequence, bitwise. ``flavour``: the
    Lightning whose methods are the manual sequence (default: the one the module subclasses)."""
    spec_nested = any(_nested_in_block(op, False) for op in program)
    shim_world = make_world()
    if flavour is None:
        flavour = flavour_of(shim_world.module)
    shim = run_program(shim_world, program, ShimDriver())
    check_calls(shim)
    if not spec_nested and not shim.nested:
        manual = run_program(make_world(), program, ManualDriver.for_flavour(flavour))
        check_calls(manual, "manual")
        compare_runs(shim, manual, shim_world)
