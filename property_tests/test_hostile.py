"""Hostile cases as draws: Ctrl-C at a drawn line of the package; a parameter refusing a write.

The invariants are those of ``tests/test_robustness.py`` (which tries every line of five fixed
scenarios): here the world and the program are drawn, and so is the line. The interrupt propagates
unchanged (the very object); ``requires_grad`` is the state before the program, or what Lightning's
manual sequence leaves when interrupted right after its toggle; nothing stays open on the module;
gradient sync is back on; the next block is a flat one, exactly Lightning's toggle.

The other hostile cases (records replaced by the body, another type of param container, stray
untoggles, bad flags) are drawn by ``worlds()`` itself, in every property.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from _hostile import Interrupter, Refusing
from hypothesis import assume, event, given
from hypothesis import strategies as st

from toggleshim import _toggle
from toggleshim.testing import Block, ShimDriver, Statement, WorldSpec, build_world, worlds
from toggleshim.testing.harness import ManualDriver, _Runner


def _plain(op: object) -> object | None:
    """``op`` without the user's own changes (so that "the state before" is what must come back)."""
    if isinstance(op, (Block, Statement)):
        body = tuple(b for b in (_plain(o) for o in op.body) if b is not None)
        return dataclasses.replace(op, body=body, fail=None) if isinstance(op, Block) else Statement(op.k, body)
    return op if type(op).__name__ == "Backward" else None


def _rg(world: Any) -> list[bool]:
    return [p.requires_grad for p in world.params]


def _record(world: Any) -> list[bool | None]:
    """Lightning's record, ``_param_requires_grad_state``, as each parameter's entry (None: none)."""
    record = world.module.__dict__.get("_param_requires_grad_state") or {}
    return [record.get(p) for p in world.params]


def _open(world: Any) -> list[Any]:
    state = _toggle._state_if_any(world.module)
    return [] if state is None else list(state.stack)


@given(spec=worlds(nesting=True, faults=False, hostile=False), data=st.data())
def test_ctrl_c_at_a_drawn_line_leaves_nothing_behind(flavour: str, spec: WorldSpec, data: st.DataObject) -> None:
    # A block at the top (a statement toggle at the top has no finally, as Lightning's: an interrupt
    # in its body leaves it toggled, and a block in its body is Lightning's flat nesting)
    ops = [_plain(op) for op in spec.program if isinstance(op, Block)]
    assume(ops)
    op = ops[0]
    assert isinstance(op, Block)
    spec = WorldSpec(spec.graph, spec.frozen, spec.optimizers, (op,), spec.wrapped)

    def run(world: Any) -> None:
        # a backward with nothing to differentiate raises: one more of the block's exit paths
        with contextlib.suppress(Exception):
            _Runner(world, ShimDriver(), check_model=False).op(op)

    counted = build_world(spec, flavour)
    with Interrupter() as counter:
        run(counted)
    assume(counter.lines > 0)
    k = data.draw(st.integers(1, counter.lines), label="interrupted line")

    twin = build_world(spec, flavour)
    ManualDriver.for_flavour(flavour).toggle(twin, op.k)
    toggled = _rg(twin)  # Lightning's manual sequence, interrupted right after its toggle
    toggled_record = _record(twin)

    world = build_world(spec, flavour)
    before = _rg(world)
    with Interrupter(k) as inter:
        try:
            run(world)
        except KeyboardInterrupt as caught:
            assert caught is inter.raised, "another exception came out than the interrupt"
        else:
            raise AssertionError(f"the interrupt at line {k} did not propagate")
    after = _rg(world)
    assert after in (before, toggled), (inter.raised, before, toggled, after)
    # the record too: none (never toggled, rolled back, or untoggled) or exactly Lightning's toggle's
    assert _record(world) in ([None] * len(world.params), toggled_record), (inter.raised, _record(world))
    assert after == toggled or _record(world) == [None] * len(world.params), "a record left behind"
    assert not _open(world), inter.raised
    assert world.strategy is not None and world.strategy.blocked == 0, "gradient sync left blocked"
    assert world.strategy.sync_log.count("enter") == world.strategy.sync_log.count("exit")
    if after != before:  # as after Lightning's toggle: the user untoggles
        world.module.untoggle_optimizer(world.opts[op.k])
        assert _rg(world) == before
    j = data.draw(st.integers(0, len(world.opts) - 1), label="next block")
    with world.module.toggle_optimizer(world.opts[j], zero_grad=False, step=False):
        stack = _open(world)
        assert len(stack) == 1 and not stack[0]._nested, "the next block is not a flat one"
        expected = build_world(spec, flavour)
        ManualDriver.for_flavour(flavour).toggle(expected, j)
        assert _rg(world) == _rg(expected)
    assert _rg(world) == before and not _open(world)


# -- failing requires_grad writes ------------------------------------------------------------------


@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_a_refused_write_is_all_or_nothing(flavour: str, spec: WorldSpec, data: st.DataObject) -> None:
    """A toggle that cannot freeze a parameter changes nothing (the refusal propagates, nothing is
    open); an exit that cannot restore one parameter restores every other one; the next block works."""
    world = build_world(WorldSpec(spec.graph, spec.frozen, spec.optimizers, (), spec.wrapped), flavour)
    i = data.draw(st.integers(0, len(world.params) - 1), label="refusing parameter")
    refuse = data.draw(st.booleans(), label="refused value")
    k = data.draw(st.integers(0, len(world.opts) - 1), label="optimizer")
    body_error = data.draw(st.sampled_from([None, ValueError("the body's own")]), label="the body raises")
    before = _rg(world)
    expected = build_world(WorldSpec(spec.graph, spec.frozen, spec.optimizers, (), spec.wrapped), flavour)
    ManualDriver.for_flavour(flavour).toggle(expected, k)
    toggled = _rg(expected)  # Lightning's toggle, nothing refused
    spec_opts = world.optimizers_spec
    managed = {j for params in spec_opts for j in params}
    own = set(spec_opts[k])
    restored = {j for n, params in enumerate(spec_opts) if n != k for j in params}
    # Which writes the toggle and its exit make: False to every managed parameter the toggled
    # optimizer does not hold; at the exit, the recorded value to every other optimizer's parameter.
    toggle_fails = not refuse and i in managed and i not in own
    exit_fails = i in restored and before[i] is refuse
    p = world.params[i]
    p.__class__ = Refusing
    p.refuse = refuse  # type: ignore[attr-defined]
    Refusing.errors.clear()
    try:
        with world.module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):
            assert not toggle_fails, "a refused freeze did not fail the toggle"
            assert _rg(world) == toggled
            if body_error is not None:
                raise body_error
    except ValueError as caught:
        # The body's exception, unchanged, even when the exit's untoggle fails too
        assert caught is body_error and not toggle_fails
        expected_after = [toggled[j] if j == i and exit_fails else v for j, v in enumerate(before)]
        assert _rg(world) == expected_after, "others not restored under the body's exception"
    except RuntimeError as caught:
        # The first refusal (the toggle's rollback and the exit's retry refuse again; they never
        # replace it)
        assert body_error is None or toggle_fails, "a refusal replaced the body's exception"
        assert caught is Refusing.errors[0], f"not the first refusal came out: {caught} of {Refusing.errors}"
        if toggle_fails:
            assert _rg(world) == before, "a toggle that could not freeze changed something"
        else:
            assert exit_fails, f"unexpected refusal: {caught}"
            # the refusing parameter keeps its value inside the block; every other one is restored
            assert _rg(world) == [toggled[j] if j == i else v for j, v in enumerate(before)], "others not restored"
    else:
        assert not toggle_fails and not exit_fails and body_error is None
        assert _rg(world) == before
    assert not _open(world)
    p.refuse = None  # type: ignore[attr-defined]
    if exit_fails:
        p.requires_grad = before[i]  # what the exit could not do
    with world.module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):
        assert _rg(world) == toggled and len(_open(world)) == 1
    assert _rg(world) == before


@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_a_refused_write_in_a_nested_block_is_all_or_nothing(
    flavour: str, spec: WorldSpec, data: st.DataObject
) -> None:
    """Inside a block over optimizer ``j``, a nested block over ``k`` whose writes one parameter
    refuses: a nested toggle that cannot complete changes nothing and leaves the outer block the only
    one open (its exit still restores everything); a nested exit that cannot restore the refusing
    parameter restores every other one. Outcomes, not write sets: the state inside is the one a twin
    world without refusals has (the model's nesting rule, checked by ``test_equivalence.py``)."""
    bare = WorldSpec(spec.graph, spec.frozen, spec.optimizers, (), spec.wrapped)
    world = build_world(bare, flavour)
    j = data.draw(st.integers(0, len(world.opts) - 1), label="outer optimizer")
    k = data.draw(st.integers(0, len(world.opts) - 1), label="nested optimizer")
    i = data.draw(st.integers(0, len(world.params) - 1), label="refusing parameter")
    refuse = data.draw(st.booleans(), label="refused value")
    twin = build_world(bare, flavour)  # the same blocks, nothing refused
    with (twin.module.toggle_optimizer(twin.opts[j], zero_grad=False, step=False),
          twin.module.toggle_optimizer(twin.opts[k], zero_grad=False, step=False)):
        inner = _rg(twin)
    before = _rg(world)
    p = world.params[i]
    with world.module.toggle_optimizer(world.opts[j], zero_grad=False, step=False):
        outer = _rg(world)
        stack = _open(world)
        record = world.module.__dict__.get("_param_requires_grad_state")
        p.__class__ = Refusing
        p.refuse = refuse  # type: ignore[attr-defined]
        Refusing.errors.clear()
        entered = False
        try:
            with world.module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):
                entered = True
                assert _rg(world) == inner, "the nested toggle did not toggle"
        except RuntimeError as caught:
            event(f"nested {'exit' if entered else 'toggle'} refused")  # both drawn: --hypothesis-show-statistics
            assert caught is Refusing.errors[0], "not the first refusal came out"
            if entered:  # the exit could not write the refusing parameter back: every other one is
                assert _rg(world) == [inner[n] if n == i else v for n, v in enumerate(outer)], "others not restored"
                assert outer[i] is refuse
            else:  # all or nothing
                assert _rg(world) == outer, "a nested toggle that could not complete changed something"
        else:
            assert _rg(world) == outer
        assert _open(world) == stack, "the outer block is not the only one open"
        now = world.module.__dict__.get("_param_requires_grad_state")
        assert now is record, "the outer record is not back"
        p.refuse = None  # type: ignore[attr-defined]
        p.requires_grad = outer[i]  # what a failed exit could not do
        with world.module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):
            assert _rg(world) == inner and len(_open(world)) == 2
        assert _rg(world) == outer
    assert _rg(world) == before and not _open(world)
