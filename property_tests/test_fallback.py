"""The fallback block as draws: on a Lightning whose toggle code toggleshim has not verified.

``tests/test_gate.py`` shows the gate and the fallback on examples (and 15 drawn worlds); here every
profile's worlds run on a fake "Lightning 2.7.0" whose toggle changed (``tests/_fake_release.py``),
so that the property suite, and the standard mutation score of ``toggleshim/_fallback.py`` with it,
sees the fallback: the block is that release's own manual sequence, bitwise, with the calls the
model expects (zero_grad, step, gradient sync, hooks, on every exit path), through both entry points
that route to it; and a nested toggle is a clear error that changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from _fake_release import fake_release, original
from _hostile import Refusing
from hypothesis import event, example, given
from hypothesis import strategies as st

import toggleshim
from toggleshim.testing import (
    FLAT_EXAMPLES,
    Block,
    ManualDriver,
    ShimDriver,
    Statement,
    WorldSpec,
    build_world,
    worlds,
)
from toggleshim.testing.harness import check_calls, compare_runs, run_program


def _routed(op: object) -> object:
    """``op`` opened through an entry point that routes to the fallback (``Toggle(...)`` is the
    shim's own class: it does not)."""
    if isinstance(op, Block):
        return dataclasses.replace(op, body=tuple(map(_routed, op.body)),
                                   entry="method" if op.entry == "Toggle" else op.entry)
    if isinstance(op, Statement):
        return dataclasses.replace(op, body=tuple(map(_routed, op.body)))
    return op


def _flat_examples(test: Any) -> Any:
    # every documented rule once (a failing zero_grad, a failing step, an interrupt...): 100 random
    # worlds drew a failing zero_grad once
    for spec in FLAT_EXAMPLES:
        test = example(spec=spec)(test)
    return test


@given(spec=worlds(nesting=False))
@_flat_examples
def test_fallback_block_is_that_releases_manual_sequence(flavour: str, spec: WorldSpec) -> None:
    program = tuple(map(_routed, spec.program))
    with fake_release(flavour, changed=True):
        world = build_world(spec, flavour)
        fallback = run_program(world, program, ShimDriver(), check_model=False)
        check_calls(fallback, "fallback")
        manual = ManualDriver(original(flavour, "toggle_optimizer"), original(flavour, "untoggle_optimizer"))
        compare_runs(fallback, run_program(build_world(spec, flavour), program, manual, check_model=False), world)


def _rg(world: Any) -> list[bool]:
    return [p.requires_grad for p in world.params]


@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_fallback_nesting_is_an_error_that_changes_nothing(flavour: str, spec: WorldSpec, data: st.DataObject) -> None:
    spec = dataclasses.replace(spec, program=())
    j = data.draw(st.integers(0, len(spec.optimizers) - 1), label="outer optimizer")
    k = data.draw(st.integers(0, len(spec.optimizers) - 1), label="nested optimizer")
    typed = data.draw(st.booleans(), label="nested through toggleshim.toggle")
    # or made as a statement before the outer block, and entered inside it
    before = data.draw(st.booleans(), label="nested toggle made before the outer block")
    flags = data.draw(st.fixed_dictionaries({}, optional={"zero_grad": st.booleans(), "step": st.booleans(),
                                                          "sync_grad": st.booleans()}), label="flags")
    with fake_release(flavour, changed=True):
        twin = build_world(spec, flavour)  # the release's own toggle and untoggle (it changed what they do)
        if before:  # the statement toggle, then the outer block over it
            for n, name in ((k, "toggle_optimizer"), (j, "toggle_optimizer"), (j, "untoggle_optimizer")):
                original(flavour, name)(twin.module, twin.opts[n])
        else:
            for n in (k, j):
                original(flavour, "toggle_optimizer")(twin.module, twin.opts[n])
                original(flavour, "untoggle_optimizer")(twin.module, twin.opts[n])
        world = build_world(spec, flavour)
        module = world.module
        statement = module.toggle_optimizer(world.opts[k], zero_grad=False, step=False)
        toggled = _rg(world)
        assert "toggled" in repr(statement), repr(statement)
        try:  # a toggle made as a statement was never entered: its __exit__ is an error
            statement.__exit__(None, None, None)
        except RuntimeError as exc:
            assert "not open" in str(exc), exc
        else:
            raise AssertionError("__exit__ of a fallback toggle never entered did not raise")
        assert _rg(world) == toggled and world.calls == [], "__exit__ without __enter__ changed something"
        module.untoggle_optimizer(world.opts[k])
        made = (toggleshim.toggle(module, world.opts[k], **flags) if typed
                else module.toggle_optimizer(world.opts[k], **flags)) if before else None
        outer = module.toggle_optimizer(world.opts[j], zero_grad=False, step=False)
        with outer:
            for p in world.params:
                p.grad = torch.ones_like(p) if p.requires_grad else None
            inside, record = _rg(world), dict(module._param_requires_grad_state)
            grads = [None if p.grad is None else p.grad.clone() for p in world.params]
            try:
                if made is not None:
                    made.__enter__()
                elif typed:
                    toggleshim.toggle(module, world.opts[k], **flags)
                else:
                    module.toggle_optimizer(world.opts[k], **flags)
            except RuntimeError as exc:
                assert "nested toggle_optimizer blocks are not available" in str(exc), exc
            else:
                raise AssertionError("a nested toggle on the fallback did not raise")
            assert _rg(world) == inside and module._param_requires_grad_state == record, "the nested toggle changed"
            assert all(
                (g is None and p.grad is None) or (g is not None and p.grad is not None and torch.equal(g, p.grad))
                for g, p in zip(grads, world.params)
            ), "the nested toggle touched gradients"
            assert world.calls == [], world.calls
            assert world.strategy is not None and world.strategy.blocked == 0
        assert _rg(world) == _rg(twin), "the outer block did not untoggle as that release does"
        if made is not None:  # the statement toggle is still the user's to untoggle
            module.untoggle_optimizer(world.opts[k])
            original(flavour, "untoggle_optimizer")(twin.module, twin.opts[k])
            assert _rg(world) == _rg(twin), "the statement toggle did not untoggle as that release does"
        # single-use, and closed for good: a second exit or entry is an error that changes nothing
        assert "closed" in repr(outer), repr(outer)
        for again in (outer.__enter__, lambda: outer.__exit__(None, None, None)):
            try:
                again()
            except RuntimeError as exc:
                assert "already used" in str(exc) or "not open" in str(exc), exc
            else:
                raise AssertionError("a closed fallback toggle was used again")
        assert _rg(world) == _rg(twin) and world.calls == [], world.calls
        with module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):  # no block left open
            pass


@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_a_fallback_block_whose_untoggle_fails_resumes_gradient_sync(
    flavour: str, spec: WorldSpec, data: st.DataObject
) -> None:
    """A fallback block with ``sync_grad=False`` whose exit's untoggle (the release's own) meets a
    parameter refusing the value it restores, after a clean body or the body's error: the first
    error comes out (the refusal, or the body's), gradient sync is back on, its context left once."""
    spec = dataclasses.replace(spec, program=())
    k = data.draw(st.integers(0, len(spec.optimizers) - 1), label="optimizer")
    body_error = data.draw(st.sampled_from([None, ValueError("the body's own")]), label="the body raises")
    with fake_release(flavour, changed=True):
        world = build_world(spec, flavour)
        module = world.module
        before = _rg(world)
        held = world.optimizers_spec
        restored = sorted({j for m, params in enumerate(held) if m != k for j in params} - set(held[k]))
        anyone = st.integers(0, len(world.params) - 1)  # often one the untoggle writes back
        i = data.draw(st.one_of(st.sampled_from(restored), anyone) if restored else anyone, label="refusing parameter")
        refused = before[i]  # refuses the value it had: the one an untoggle would give back
        Refusing.errors.clear()
        try:
            with module.toggle_optimizer(world.opts[k], zero_grad=False, step=False, sync_grad=False):
                world.params[i].__class__ = Refusing
                world.params[i].refuse = refused  # type: ignore[attr-defined]
                assert world.strategy is not None and world.strategy.blocked == 1
                if body_error is not None:
                    raise body_error
        except ValueError as caught:
            assert caught is body_error, "the body's exception was replaced"
        except RuntimeError as caught:
            assert body_error is None and caught is Refusing.errors[0], "not the first error came out"
        else:
            assert body_error is None and not Refusing.errors, "an error was swallowed"
        world.params[i].refuse = None  # type: ignore[attr-defined]
        event(f"{len(Refusing.errors)} refusals, the body {'raises' if body_error else 'ends'}")
        assert world.strategy is not None and world.strategy.blocked == 0, "gradient sync left blocked"
        assert world.strategy.sync_log == ["enter", "exit"], world.strategy.sync_log
