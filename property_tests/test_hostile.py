"""Hostile cases as draws: Ctrl-C at a drawn line of the package; a parameter refusing a write.

The invariants are those of ``tests/test_robustness.py`` (which tries every line of ten fixed
scenarios): here the world and the program are drawn, and so is the line, and the module's class:
Lightning's methods, or a user's overrides that delegate to them (``_user_worlds``), whose
``untoggle_optimizer`` the block must call no more often than uninterrupted. The interrupt propagates
unchanged (the very object); ``requires_grad`` is the state before the program, or what Lightning's
manual sequence leaves when interrupted right after its toggle; nothing stays open on the module;
gradient sync is back on; the next block is a flat one, exactly Lightning's toggle.

The other hostile cases (records replaced by the body, another type of param container, stray
untoggles, bad flags) are drawn by ``worlds()`` itself, in every property.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch
from _hostile import Interrupter, Refusing
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

import toggleshim
from toggleshim import _toggle
from toggleshim.testing import (
    FLAT_EXAMPLES,
    Block,
    Overrides,
    ShimDriver,
    Statement,
    WorldSpec,
    build_world,
    worlds,
)
from toggleshim.testing.harness import ManualDriver, _Runner, _wrap
from toggleshim.testing.specs import _method_entry_works


def _plain(op: object) -> object | None:
    """``op`` without the user's own changes (so that "the state before" is what must come back)."""
    if isinstance(op, (Block, Statement)):
        body = tuple(b for b in (_plain(o) for o in op.body) if b is not None)
        return dataclasses.replace(op, body=body, **({"fail": None} if isinstance(op, Block) else {}))
    return op if type(op).__name__ == "Backward" else None


@st.composite
def _user_worlds(draw: st.DrawFn, nesting: bool) -> WorldSpec:
    """A world whose module's class overrides both methods, delegating only: ``toggle_optimizer``
    not at all, or calling ``super()`` and returning its toggle, or returning None (its ``super()``'s
    toggle is the block all the same); ``untoggle_optimizer`` calling ``super()``. No
    ``requires_grad`` of their own (what an interrupted override that writes leaves is the user's,
    not toggleshim's); every call logged (``override_log``)."""
    spec = draw(worlds(nesting=nesting, faults=False, hostile=False, user_class=True))
    toggle = draw(st.sampled_from(["none", "super", None]), label="toggle_optimizer override")
    program = _method_entry_works(spec.program) if toggle == "none" else spec.program
    return dataclasses.replace(spec, program=program, overrides=Overrides(toggle=toggle, untoggle="super"))


# Lightning's own methods (half the worlds), or a user class whose overrides delegate; interrupted
# at any line, the block calls the user's untoggle_optimizer no more often than uninterrupted
_PLAIN = worlds(nesting=True, faults=False, hostile=False)
_WORLDS = st.one_of(_PLAIN, _PLAIN, _user_worlds(nesting=True), _user_worlds(nesting=False))


def _untoggles(world: Any) -> int:
    return list(getattr(world.module, "override_log", [])).count("untoggle")


def _rg(world: Any) -> list[bool]:
    return [p.requires_grad for p in world.params]


def _record(world: Any) -> list[bool | None]:
    """Lightning's record, ``_param_requires_grad_state``, as each parameter's entry (None: none)."""
    record = world.module.__dict__.get("_param_requires_grad_state") or {}
    return [record.get(p) for p in world.params]


def _open(world: Any) -> list[Any]:
    state = _toggle.state_if_any(world.module)
    return [] if state is None else list(state.stack)


def _top_block(spec: WorldSpec) -> tuple[WorldSpec, Block]:
    """The world with its program cut to its first top-level block, without the user's own changes (a
    statement toggle at the top has no finally, as Lightning's: an interrupt in its body leaves it
    toggled, and a block in its body is Lightning's flat nesting)."""
    ops = [_plain(op) for op in spec.program if isinstance(op, Block)]
    assume(ops)
    op = ops[0]
    assert isinstance(op, Block)
    return dataclasses.replace(spec, program=(op,)), op


def _run(op: Block) -> Callable[[Any], None]:
    def run(world: Any) -> None:
        # a backward with nothing to differentiate raises: one more of the block's exit paths
        with contextlib.suppress(Exception):
            _Runner(world, ShimDriver(), check_model=False).op(op)

    return run


def _count(flavour: str, spec: WorldSpec, op: Block) -> Interrupter:
    """The lines the block runs (``Interrupter`` counting)."""
    with Interrupter() as counter:
        _run(op)(build_world(spec, flavour))
    assume(counter.lines > 0)
    return counter


def _through_exit_stack(op: object) -> bool:
    """``op`` is a block entered through ``contextlib.ExitStack`` or by hand, or holds one."""
    return isinstance(op, (Block, Statement)) and (
        getattr(op, "way", None) in ("ExitStack", "by hand") or any(_through_exit_stack(o) for o in op.body))


class _Interrupted:
    """Runs the block of a world interrupted by an ``Interrupter``, then checks that it left nothing
    behind: the interrupt propagated, the very object; ``requires_grad`` and the record are the state
    before, or exactly Lightning's toggle's (interrupted right after it: the user's untoggle gives the
    state before back); nothing is open; gradient sync is back on and balanced; the next block, over
    ``j``, is a flat one, exactly Lightning's toggle."""

    def __init__(self, flavour: str, spec: WorldSpec, op: Block, j: int) -> None:
        self.flavour, self.spec, self.op, self.j = flavour, spec, op, j
        twin = build_world(spec, flavour)
        ManualDriver.for_flavour(flavour).toggle(twin, op.k)
        self.toggled, self.toggled_record = _rg(twin), _record(twin)  # Lightning's, interrupted after its toggle
        expected = build_world(spec, flavour)
        ManualDriver.for_flavour(flavour).toggle(expected, j)
        self.next_block = _rg(expected)
        whole = build_world(spec, flavour)
        _run(op)(whole)
        self.untoggles = _untoggles(whole)  # the user's untoggle_optimizer calls, uninterrupted

    def check(self, inter: Interrupter) -> None:
        op, toggled = self.op, self.toggled
        world = build_world(self.spec, self.flavour)
        before = _rg(world)
        with inter:
            try:
                _run(op)(world)
            except KeyboardInterrupt as caught:
                assert caught is inter.raised, "another exception came out than the interrupt"
            else:
                raise AssertionError(f"the interrupt at line {inter.k or inter.site} did not propagate")
        where = inter.where
        assert _untoggles(world) <= self.untoggles, f"{where}: the user's untoggle_optimizer called again"
        if _through_exit_stack(op):
            # the interrupt handled and let go of: the stack's frame in its traceback held the exit it
            # was calling (the with statement's way is closed at once: the harness checks it there). A
            # block entered through ExitStack inside a with statement's block: the outer exit undid
            # its toggle, and its no-sync context is left once the traceback is let go of
            assert inter.raised is not None
            # (and the exception the body raised, if any, the interrupt's context: its traceback holds
            # the frames that called the exit by hand)
            for exc in (inter.raised, *world.raised):
                exc.__traceback__ = None
            inter.raised = None
            gc.collect()
        after = _rg(world)
        none = [None] * len(world.params)
        assert after in (before, toggled), (where, before, toggled, after)
        # the record too: none (never toggled, rolled back, or untoggled) or exactly Lightning's toggle's
        assert _record(world) in (none, self.toggled_record), (where, _record(world))
        assert after == toggled or _record(world) == none, f"{where}: a record left behind"
        assert not _open(world), where
        assert world.strategy is not None and world.strategy.blocked == 0, f"{where}: gradient sync left blocked"
        assert world.strategy.sync_log.count("enter") == world.strategy.sync_log.count("exit"), where
        if _record(world) != none:  # as after Lightning's toggle: the user untoggles
            world.module.untoggle_optimizer(world.opts[op.k])
            assert _rg(world) == before, where
        with toggleshim.toggle(world.module, world.opts[self.j], zero_grad=False, step=False):
            stack = _open(world)
            assert len(stack) == 1 and type(stack[0]) is _toggle._Flat, f"{where}: the next block is not a flat one"
            assert _rg(world) == self.next_block, where
        assert _rg(world) == before and not _open(world), where


@given(spec=_WORLDS, data=st.data())
def test_ctrl_c_at_a_drawn_line_leaves_nothing_behind(flavour: str, spec: WorldSpec, data: st.DataObject) -> None:
    spec, op = _top_block(spec)
    ov = spec.overrides
    event("Lightning's methods" if ov is None else f"a user class: toggle {ov.toggle}, untoggle {ov.untoggle}")
    counter = _count(flavour, spec, op)
    if data.draw(st.booleans(), label="a line the program runs, each equally likely"):
        # else a count, so lines run in loops are likelier: this way a line run once (the last line
        # of a nested toggle) is as likely as any other
        sites = counter.sites
        site = data.draw(st.sampled_from(sorted(set(sites))), label="line")
        k = data.draw(st.sampled_from([n + 1 for n, s in enumerate(sites) if s == site]), label="its run")
    else:
        k = data.draw(st.integers(1, counter.lines), label="interrupted line")
    j = data.draw(st.integers(0, len(spec.optimizers) - 1), label="next block")
    _Interrupted(flavour, spec, op, j).check(Interrupter(k))


# Each example runs its block about six times (a fresh world each): an eighth of the profile's examples
@settings(max_examples=max(5, settings.default.max_examples // 8))
@given(spec=_WORLDS, data=st.data())
def test_ctrl_c_at_the_first_line_of_every_call_leaves_nothing_behind(
    flavour: str, spec: WorldSpec, data: st.DataObject
) -> None:
    """The lines no ``try`` of a function's own can catch an interrupt at: the first line of a
    function of the package a block calls (its first call), in a fresh world each, every way into the
    block drawn: each ``__enter__`` and ``__exit__`` the with statement or ``ExitStack`` calls (where
    only the exit guard can close the block), and a drawn few of the others (the toggle, the untoggle,
    each cleanup); what the drawn-line property checks, after each. (A drawn line lands on one of
    these with a probability of about one in a hundred.)"""
    spec, op = _top_block(spec)
    counter = _count(flavour, spec, op)
    j = data.draw(st.integers(0, len(spec.optimizers) - 1), label="next block")
    interrupted = _Interrupted(flavour, spec, op, j)
    sites = list(dict.fromkeys(counter.entries))
    protocol = [s for s in sites if counter.names[s] in ("__enter__", "__exit__", "_exit")]
    others = [s for s in sites if s not in protocol]
    drawn = data.draw(st.lists(st.sampled_from(others), max_size=4, unique=True), label="other functions")
    event(f"{len(protocol)} entries and exits, of {len(sites)} functions ({op.way})")
    for site in protocol + drawn:
        interrupted.check(Interrupter(site=site))


# Each example interrupts every line of a nested block (about a hundred runs): a quarter of the
# profile's examples keeps its time that of the other properties.
@settings(max_examples=max(5, settings.default.max_examples // 4))
@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_ctrl_c_in_a_nested_block_caught_by_the_body_leaves_what_is_open_as_it_is(
    flavour: str, spec: WorldSpec, data: st.DataObject
) -> None:
    """Inside a block over ``j`` whose body catches ``KeyboardInterrupt`` and goes on, a block over
    ``k`` is interrupted, at each line it runs in turn. Then what is open and
    ``requires_grad`` agree: the outer block alone, in its own state; or, interrupted between the
    nested toggle and its ``with``, that toggle too, in its toggled state (its untoggle closes it).
    The outer block's exit then restores everything."""
    bare = dataclasses.replace(spec, program=())
    n = len(spec.optimizers)
    j, k = (data.draw(st.integers(0, n - 1), label=label) for label in ("outer block", "nested block"))

    def nested(world: Any) -> None:
        with world.module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):
            pass

    twin = build_world(bare, flavour)
    with twin.module.toggle_optimizer(twin.opts[j], zero_grad=False, step=False):
        outer_state = _rg(twin)
        twin.module.toggle_optimizer(twin.opts[k])
        toggled = _rg(twin)  # the nested toggle, made and not yet entered
        twin.module.untoggle_optimizer(twin.opts[k])
        with Interrupter() as counter:
            nested(twin)
    # every line the nested block runs (at its first run): a line run once, such as the last of the
    # nested toggle, is reached in every example
    sites = list(dict.fromkeys(counter.sites))

    world = build_world(bare, flavour)
    before = _rg(world)
    with world.module.toggle_optimizer(world.opts[j], zero_grad=False, step=False):
        outer = _open(world)
        for site in sites:
            with Interrupter(site=site) as inter:
                try:
                    nested(world)
                except KeyboardInterrupt as caught:  # the body goes on
                    assert caught is inter.raised
            if inter.raised is None:  # a line only the first nested block runs (planning): done then
                continue
            stack = _open(world)
            assert stack[:1] == outer and len(stack) <= 2, inter.where
            if len(stack) == 1:
                assert _rg(world) == outer_state, f"{inter.where}: nothing open, not the outer block's state"
            else:
                assert type(stack[1]) is _toggle._Nested and not stack[1].entered, inter.where
                assert _rg(world) == toggled, f"{inter.where}: a toggle open that its state does not show"
                world.module.untoggle_optimizer(world.opts[k])
                assert _rg(world) == outer_state and _open(world) == outer
    assert _rg(world) == before and not _open(world)


# -- failing requires_grad writes ------------------------------------------------------------------


@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_a_refused_write_is_all_or_nothing(flavour: str, spec: WorldSpec, data: st.DataObject) -> None:
    """Up to three parameters refuse a value each. A toggle that cannot freeze a parameter puts every
    other one back (the refusal propagates, nothing is open): only a refusing parameter can keep what
    it refuses to give back. An exit that cannot restore a parameter restores every other one. The
    first refusal propagates, and never replaces the body's exception; the next block works."""
    bare = dataclasses.replace(spec, program=())
    world = build_world(bare, flavour)
    n = len(world.params)
    k = data.draw(st.integers(0, len(world.opts) - 1), label="optimizer")
    restored = sorted({j for m, params in enumerate(world.optimizers_spec) if m != k for j in params})
    # often the exit's parameters (several refused writes at one exit: the first refusal must come out)
    param = st.one_of(st.sampled_from(restored), st.integers(0, n - 1)) if restored else st.integers(0, n - 1)
    refusing = data.draw(st.dictionaries(param, st.booleans(), min_size=1, max_size=3),
                         label="refusing parameters, and the value each refuses")
    body_error = data.draw(st.sampled_from([None, ValueError("the body's own")]), label="the body raises")
    before = _rg(world)
    expected = build_world(bare, flavour)
    ManualDriver.for_flavour(flavour).toggle(expected, k)
    toggled = _rg(expected)  # Lightning's toggle, nothing refused
    spec_opts = world.optimizers_spec
    own = set(spec_opts[k])
    frozen_by_toggle = {j for params in spec_opts for j in params} - own
    # Which writes the toggle and its exit make: False to every managed parameter the toggled
    # optimizer does not hold; at the exit, the recorded value to every other optimizer's parameter.
    toggle_fails = any(j in frozen_by_toggle and value is False for j, value in refusing.items())
    exit_fails = {j for j, value in refusing.items() if j in restored and before[j] is value}
    event(f"{len(refusing)} refusing, toggle {'fails' if toggle_fails else 'completes'}, "
          f"{len(exit_fails)} refused at the exit")
    for j, value in refusing.items():
        world.params[j].__class__ = Refusing
        world.params[j].refuse = value  # type: ignore[attr-defined]
    Refusing.errors.clear()
    after_exit = [toggled[j] if j in exit_fails else v for j, v in enumerate(before)]
    try:
        with world.module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):
            assert not toggle_fails, "a refused freeze did not fail the toggle"
            assert _rg(world) == toggled
            if body_error is not None:
                raise body_error
    except ValueError as caught:
        # The body's exception, unchanged, even when the exit's untoggle fails too
        assert caught is body_error and not toggle_fails
        assert _rg(world) == after_exit, "others not restored under the body's exception"
    except RuntimeError as caught:
        # The first refusal (the toggle's rollback and the exit's retry refuse again; later refusals
        # never replace it)
        assert body_error is None or toggle_fails, "a refusal replaced the body's exception"
        assert caught is Refusing.errors[0], f"not the first refusal came out: {caught} of {Refusing.errors}"
        if toggle_fails:
            after = _rg(world)
            changed = {j for j in range(n) if after[j] != before[j]}
            assert changed <= set(refusing), f"a toggle that could not freeze changed {changed - set(refusing)}"
            assert all(not after[j] for j in changed), "a refusing parameter was given what it refuses"
        else:
            assert exit_fails, f"unexpected refusal: {caught}"
            # a refusing parameter keeps its value inside the block; every other one is restored
            assert _rg(world) == after_exit, "others not restored"
    else:
        assert not toggle_fails and not exit_fails and body_error is None
        assert _rg(world) == before
    assert not _open(world)
    for j in refusing:
        world.params[j].refuse = None  # type: ignore[attr-defined]
        world.params[j].requires_grad = before[j]  # what the toggle's rollback or the exit could not do
    with world.module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):
        assert _rg(world) == toggled and len(_open(world)) == 1
    assert _rg(world) == before


def test_two_refusals_at_one_exit_the_first_propagates(flavour: str) -> None:
    """The hand-picked world for the rule the property above draws: two parameters refuse the value
    the exit must give back (the exit makes every write, then retries once): the first refusal comes
    out, the very object, and every other parameter is restored."""
    spec = dataclasses.replace(FLAT_EXAMPLES[1], frozen=(), program=())
    world = build_world(spec, flavour)
    assert world.optimizers_spec == [[0, 1], [1, 2, 3]]  # the block over optimizer 0 restores 1, 2, 3
    before = _rg(world)
    for j in (2, 3):
        world.params[j].__class__ = Refusing
        world.params[j].refuse = True  # type: ignore[attr-defined]
    Refusing.errors.clear()
    try:
        with world.module.toggle_optimizer(world.opts[0], zero_grad=False, step=False):
            pass
    except RuntimeError as caught:
        assert len(Refusing.errors) == 4 and caught is Refusing.errors[0], (caught, Refusing.errors)
    else:
        raise AssertionError("the refused writes did not propagate")
    assert _rg(world)[:2] == before[:2] and not _open(world)
    for j in (2, 3):
        world.params[j].refuse = None  # type: ignore[attr-defined]


@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_a_refused_write_in_a_nested_block_is_all_or_nothing(
    flavour: str, spec: WorldSpec, data: st.DataObject
) -> None:
    """Inside a block over optimizer ``j``, a nested block over ``k`` whose writes one parameter
    refuses: a nested toggle that cannot complete changes nothing and leaves the outer block the only
    one open (its exit still restores everything); a nested exit that cannot restore the refusing
    parameter restores every other one. Outcomes, not write sets: the state inside is the one a twin
    world without refusals has (the model's nesting rule, checked by ``test_equivalence.py``)."""
    bare = dataclasses.replace(spec, program=())
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


@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_an_exit_unwinding_several_toggles_makes_every_write_it_can(
    flavour: str, spec: WorldSpec, data: st.DataObject
) -> None:
    """A block over ``j`` whose body leaves a statement toggle over ``k`` open: its exit unwinds both
    (innermost first). With parameters that refuse a value each, every write that can be made is
    made: every other parameter is back to the state before the block, the first refusal propagates,
    nothing stays open."""
    bare = dataclasses.replace(spec, program=())
    world = build_world(bare, flavour)
    n = len(world.params)
    j = data.draw(st.integers(0, len(world.opts) - 1), label="block")
    k = data.draw(st.integers(0, len(world.opts) - 1), label="statement left open")
    refusing = data.draw(st.dictionaries(st.integers(0, n - 1), st.booleans(), min_size=1, max_size=2),
                         label="refusing parameters, and the value each refuses")
    before = _rg(world)
    Refusing.errors.clear()
    try:
        with world.module.toggle_optimizer(world.opts[j], zero_grad=False, step=False):
            world.module.toggle_optimizer(world.opts[k])  # a statement toggle, never untoggled
            for i, value in refusing.items():  # from here on, these parameters refuse a value
                world.params[i].__class__ = Refusing
                world.params[i].refuse = value  # type: ignore[attr-defined]
    except RuntimeError as caught:
        assert caught is Refusing.errors[0], "not the first refusal came out"
    else:
        assert not Refusing.errors, "a refusal was swallowed"
    event(f"{len(Refusing.errors)} refusals while unwinding")
    after = _rg(world)
    changed = {i for i in range(n) if after[i] != before[i]}
    assert changed <= set(refusing), f"parameters {changed - set(refusing)} not restored"
    assert all(after[i] is not before[i] and before[i] is refusing[i] for i in changed)
    assert not _open(world)
    for i in refusing:
        world.params[i].refuse = None  # type: ignore[attr-defined]


# -- the trainer's optimizers edited between blocks --------------------------------------------------


@contextlib.contextmanager
def _no_full_collection() -> Iterator[None]:
    """No automatic garbage collection meanwhile: a full one drops every cached plan (as it must), and
    with them the stale plans a bug would reuse, so whether a draw shows such a bug would depend on
    when the collector runs."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# positions taken modulo the list's length; -1 is the last (the optimizer a layout loses first)
_EDITS = st.lists(st.tuples(st.sampled_from(["append", "insert", "remove", "replace"]), st.integers(-1, 7),
                            st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True)), min_size=1, max_size=3)


def _edit_optimizers(world: Any, edits: list[tuple[str, int, list[int]]]) -> None:
    """Apply ``edits`` to ``trainer.optimizers`` (in place, as a callback re-configuring the optimizers
    does): a new SGD over the parameters drawn (indices taken modulo their number) appended, inserted
    at a position, or replacing one; or one removed."""
    opts = world.module.trainer.optimizers
    n = len(world.params)
    for how, at, params in edits:
        new = torch.optim.SGD(list({id(world.params[i % n]): world.params[i % n] for i in params}.values()), lr=0.1)
        if how == "append":
            opts.append(new)
        elif how == "insert":
            opts.insert(at % (len(opts) + 1), new)
        elif how == "replace" and opts:
            opts[at % len(opts)] = new
        elif how == "remove" and len(opts) > 1:
            del opts[at % len(opts)]


@given(spec=worlds(nesting=False, faults=False, hostile=False), edits=_EDITS, data=st.data())
def test_blocks_follow_the_trainers_optimizers_when_they_change(
    flavour: str, spec: WorldSpec, edits: list[tuple[str, int, list[int]]], data: st.DataObject
) -> None:
    """A block over every optimizer (plans are cached), then optimizers appended to, inserted into,
    removed from or replaced in ``trainer.optimizers``, maybe while a block is open (the user may set a
    ``requires_grad`` inside it): the state after
    that block, and inside and after a block over any optimizer of the new list (or one outside it
    holding only the trainer's parameters), is exactly what Lightning's toggle and untoggle make on a
    twin world with the same edits (the record too)."""
    with _no_full_collection():
        bare = dataclasses.replace(spec, program=())
        world, twin = build_world(bare, flavour), build_world(bare, flavour)
        manual = ManualDriver.for_flavour(flavour)

        def plan_every_optimizer() -> None:
            """A plan cached for every optimizer of the list about to be edited, right before the edits (a
            full collection in between drops the cache: the stale plans an edit must never reuse would be
            gone), in a drawn order (the last one planned is the likeliest to be reused). Blocks with
            nothing in them: they change nothing."""
            before = _rg(world)
            opts = world.module.trainer.optimizers
            for k in data.draw(st.permutations(range(len(opts))), label="the order the plans are made in"):
                with world.module.toggle_optimizer(opts[k], zero_grad=False, step=False):
                    pass
                planned[:] = [opts[k]]
            assert _rg(world) == before

        planned: list[Any] = []  # the optimizer planned last

        if data.draw(st.booleans(), label="a block open across the edits"):
            i = data.draw(st.integers(0, len(world.opts) - 1), label="its optimizer")
            with world.module.toggle_optimizer(world.opts[i], zero_grad=False, step=False):
                manual.toggle(twin, i)
                if data.draw(st.booleans(), label="the user flips a requires_grad of the block's optimizer"):
                    # Lightning's untoggle leaves the toggled optimizer's parameters as they are, unless the
                    # edited list has another optimizer holding one: then it restores the recorded value
                    n = data.draw(st.sampled_from(world.optimizers_spec[i]), label="which parameter")
                    world.params[n].requires_grad = twin.params[n].requires_grad = not world.params[n].requires_grad
                    if data.draw(st.booleans(), label="an optimizer over it appended"):
                        edits = [*edits, ("append", 0, [n])]
                plan_every_optimizer()  # nested blocks
                before_edits = list(world.module.trainer.optimizers)
                if data.draw(st.booleans(), label="only the last optimizers removed"):
                    last = data.draw(st.integers(1, max(1, len(before_edits) - 1)), label="how many")
                    edits = [("remove", -1, [0])] * min(last, len(before_edits) - 1)
                _edit_optimizers(world, edits)
                _edit_optimizers(twin, edits)
                after_edits = world.module.trainer.optimizers
                # the layout at the exit: another, or the first optimizers of the toggled one (a prefix)
                event("open block: " + ("the same optimizers" if after_edits == before_edits else
                                        "a prefix" if before_edits[:len(after_edits)] == after_edits else "others"))
            manual.untoggle(twin, i)  # Lightning's untoggle over the edited list
            assert _rg(world) == _rg(twin), "a block open across the edits ended otherwise than Lightning's untoggle"
            assert _record(world) == _record(twin)
        else:
            plan_every_optimizer()
            _edit_optimizers(world, edits)
            _edit_optimizers(twin, edits)
        opts, twin_opts = world.module.trainer.optimizers, twin.module.trainer.optimizers
        last = [k for k, opt in enumerate(opts) if opt is planned[0]]
        if last and data.draw(st.booleans(), label="the optimizer planned last, where still in the list"):
            j = last[0]
        else:
            j = data.draw(st.integers(0, len(opts) - 1), label="optimizer of the edited list")
        opt, twin_opt = opts[j], twin_opts[j]
        held = sorted({i for i, p in enumerate(world.params) for o in opts for g in o.param_groups
                       if any(p is q for q in g["params"])})
        if data.draw(st.booleans(), label="an optimizer outside the list instead") and held:
            # legal: one that holds only parameters the trainer's optimizers hold (else a clear error)
            chosen = data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True), label="its parameters")
            opt = torch.optim.SGD([world.params[i] for i in chosen], lr=0.1)
            twin_opt = torch.optim.SGD([twin.params[i] for i in chosen], lr=0.1)
        before = _rg(world)
        manual._toggle(twin.module, twin_opt)
        with world.module.toggle_optimizer(opt, zero_grad=False, step=False):
            assert _rg(world) == _rg(twin), "the block did not toggle as Lightning does over the edited list"
            assert _record(world) == _record(twin)
            manual._untoggle(twin.module, twin_opt)
        assert _rg(world) == _rg(twin) == before

# -- optimizer objects made for a block and freed after it --------------------------------------------

# each: a new LightningOptimizer around trainer.optimizers[k], or a new optimizer outside the list
# over some of the parameters the list holds (indices taken modulo their number)
_FRESH = st.lists(st.tuples(st.sampled_from(["wrapper", "outside"]), st.integers(0, 3),
                            st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True)), min_size=2, max_size=5)


@given(spec=worlds(nesting=False, faults=False, hostile=False), fresh=_FRESH)
def test_an_optimizer_made_where_a_freed_one_was_is_toggled_as_itself(
    flavour: str, spec: WorldSpec, fresh: list[tuple[str, int, list[int]]]
) -> None:
    """Blocks over optimizer objects made for the block and freed after it, one after the other: a new
    ``LightningOptimizer`` around one of ``trainer.optimizers``, or an optimizer outside the list that
    holds some of their parameters. CPython makes a new object where the one just freed was, so its
    ``id`` repeats: each block is still Lightning's toggle and untoggle of the object it is given (a
    cached plan is never taken for another object's because of an address)."""
    bare = dataclasses.replace(spec, program=())
    world, twin = build_world(bare, flavour), build_world(bare, flavour)
    manual = ManualDriver.for_flavour(flavour)
    opts, twin_opts = world.module.trainer.optimizers, twin.module.trainer.optimizers
    held = sorted({j for params in world.optimizers_spec for j in params})
    before = _rg(world)
    ids: list[int] = []
    for kind, k, chosen in fresh:
        if kind == "wrapper":
            k %= len(opts)
            opt: Any = _wrap(flavour, opts[k], world.strategy, k)
            twin_opt: Any = twin_opts[k]
        else:
            params = sorted({held[i % len(held)] for i in chosen})
            opt = torch.optim.SGD([world.params[j] for j in params], lr=0.1)
            twin_opt = torch.optim.SGD([twin.params[j] for j in params], lr=0.1)
        ids.append(id(opt))
        manual._toggle(twin.module, twin_opt)
        with world.module.toggle_optimizer(opt, zero_grad=False, step=False):
            assert _rg(world) == _rg(twin), f"a block over {kind} {len(ids)} did not toggle as Lightning does"
            assert _record(world) == _record(twin)
            manual._untoggle(twin.module, twin_opt)
        assert _rg(world) == _rg(twin) == before
        del opt, twin_opt  # freed here: the next one is made where it was
    event(f"{len(ids) - len(set(ids))} made where a freed one was")


# -- a toggle made, then entered ---------------------------------------------------------------------


_BETWEEN = st.sampled_from(["nothing", "nothing", "untoggled", "another toggle", "a block", "record copied"])


@given(spec=worlds(nesting=False, faults=False, hostile=False), between=_BETWEEN, data=st.data())
def test_a_toggle_is_entered_where_it_is_made(flavour: str, spec: WorldSpec, between: str, data: st.DataObject) -> None:
    """``t = self.toggle_optimizer(opt)`` then ``with t:``, at the top or inside a block. Entered
    right away, or after a block that nested in it, it is the block (Lightning's toggle inside,
    everything back after). If between the two it was untoggled, superseded by another toggle, or its
    record was replaced (even by an equal copy), ``with t:`` is a RuntimeError that says so and
    changes nothing. Entered again after
    its block, it is a RuntimeError that says a toggle is single-use, and changes nothing."""
    bare = dataclasses.replace(spec, program=())
    world, twin = build_world(bare, flavour), build_world(bare, flavour)
    module, n = world.module, len(world.opts)
    j, k, m = (data.draw(st.integers(0, n - 1), label=label) for label in ("outer block", "toggle", "the other"))
    inside = data.draw(st.booleans(), label="inside a block")
    event(f"{between}, {'inside a block' if inside else 'at the top'}")
    start = _rg(world)
    with contextlib.ExitStack() as outer:
        if inside:
            outer.enter_context(module.toggle_optimizer(world.opts[j], zero_grad=False, step=False))
            ManualDriver.for_flavour(flavour).toggle(twin, j)
        t = module.toggle_optimizer(world.opts[k], zero_grad=False, step=False)
        if between == "untoggled":
            module.untoggle_optimizer(world.opts[k])
        elif between == "another toggle":
            module.toggle_optimizer(world.opts[m])
        elif between == "a block":
            with module.toggle_optimizer(world.opts[m], zero_grad=False, step=False):
                pass
        elif between == "record copied":
            module._param_requires_grad_state = dict(module._param_requires_grad_state)
        before, record, stack = _rg(world), module.__dict__.get("_param_requires_grad_state"), _open(world)
        # A block opened and closed while t is open (inside the outer block, or at the top where t is
        # an open statement toggle) is nested in t and gives t back its record.
        enters = between in ("nothing", "a block")
        if enters:
            if not inside:  # Lightning's toggle (inside a block: the nesting rule, test_equivalence.py)
                ManualDriver.for_flavour(flavour).toggle(twin, k)
                assert before == _rg(twin)
            with t as opt:
                assert opt is world.opts[k] and _rg(world) == before and _open(world)[-1] is t._made
            assert _open(world) == stack[:1] if inside else not _open(world)
        else:
            try:
                with t:
                    raise AssertionError(f"a toggle {between} before its block was entered")
            except RuntimeError as exc:
                # untoggled (closed inside a block, its record emptied at the top), superseded or its
                # record replaced: never "already used", which is for a toggle whose block ran
                assert "undone or superseded" in str(exc) and "nothing was changed" in str(exc), str(exc)
            if between == "untoggled":
                # a kept statement toggle (IPython's Out[]) holds nothing of the user's once untoggled,
                # and says so
                held = gc.get_referents(t)
                assert not any(o is module or o in world.opts or isinstance(o, torch.Tensor) for o in held), held
                assert repr(t) == "<toggleshim.Toggle untoggled (holds nothing)>", repr(t)
            assert _rg(world) == before, "a refused with statement changed requires_grad"
            assert module.__dict__.get("_param_requires_grad_state") is record and _open(world) == stack
        after, opened = _rg(world), _open(world)
        try:
            t.__enter__()
        except RuntimeError as exc:
            assert "already used" in str(exc) or not enters, str(exc)
        else:
            raise AssertionError("a toggle was entered twice")
        assert _rg(world) == after and _open(world) == opened, "entering a used toggle changed something"
    if enters:
        assert _rg(world) == start, "not everything is back after the blocks"


@given(spec=worlds(nesting=False, faults=False, hostile=False), data=st.data())
def test_an_optimizer_with_its_own_optimizer_attribute_is_not_unwrapped(
    flavour: str, spec: WorldSpec, data: st.DataObject
) -> None:
    """A torch optimizer of ``trainer.optimizers`` that a library gave an attribute ``_optimizer``
    (pointing at another of the trainer's optimizers): only a ``LightningOptimizer`` is unwrapped, so
    the block toggles the optimizer passed, exactly as Lightning's toggle does."""
    bare = dataclasses.replace(spec, program=())
    world, twin = build_world(bare, flavour), build_world(bare, flavour)
    n = len(world.opts)
    j, k = (data.draw(st.integers(0, n - 1), label=label) for label in ("toggled", "its _optimizer"))
    for w in (world, twin):
        w.module.trainer.optimizers[j]._optimizer = w.module.trainer.optimizers[k]
    before = _rg(world)
    ManualDriver.for_flavour(flavour)._toggle(twin.module, twin.module.trainer.optimizers[j])
    with world.module.toggle_optimizer(world.module.trainer.optimizers[j], zero_grad=False, step=False):
        assert _rg(world) == _rg(twin), "the block toggled another optimizer than the one passed"
    assert _rg(world) == before


# -- bad optimizers ----------------------------------------------------------------------------------


class _NotAnOptimizer:
    """Something passed by mistake: no ``param_groups``, groups of another shape, a raising repr."""

    def __init__(self, groups: object, text: str | None) -> None:
        if groups is not None:
            self.param_groups = groups
        self.text = text

    def __repr__(self) -> str:
        if self.text is None:
            raise RuntimeError("repr exploded")
        return self.text


_BAD = st.sampled_from(["not an optimizer", "stranger", "non-tensor in the trainer's", "non-tensor in the passed",
                        "the trainer's not an optimizer"])


@given(text=st.one_of(st.text(min_size=78, max_size=82), st.text(max_size=200)))
def test_a_description_is_the_repr_cut_to_80_characters(text: str) -> None:
    """How an error message shows an object: ``module.Class (repr)``, the repr cut to 77 characters
    and ``...`` when longer than 80 (often right at the cut)."""
    described = _toggle._describe(_NotAnOptimizer(None, text))
    shown = text if len(text) <= 80 else text[:77] + "..."
    assert described.endswith(f"_NotAnOptimizer ({shown})"), (len(text), described)


@given(spec=worlds(nesting=False, faults=False, hostile=False), how=_BAD, data=st.data())
def test_a_bad_optimizer_is_a_clear_error_that_changes_nothing(
    flavour: str, spec: WorldSpec, how: str, data: st.DataObject
) -> None:
    """``toggle_optimizer`` given something it cannot toggle, in a drawn world with plans cached or
    not: the error names the problem (the object, described by its repr cut to 80 characters, or a
    raising repr survived; the parameter none of ``trainer.optimizers`` holds, by its name in the
    module or its shape; the non-tensor where a parameter belongs; the entry of ``trainer.optimizers``
    that is not an optimizer), and nothing changed; the next block is exactly Lightning's toggle."""
    bare = dataclasses.replace(spec, program=())
    world = build_world(bare, flavour)
    if data.draw(st.booleans(), label="plans cached"):
        for opt in world.opts:
            with world.module.toggle_optimizer(opt, zero_grad=False, step=False):
                pass
    names = {id(p): name for name, p in world.module.named_parameters(remove_duplicate=False)}
    held = {id(p) for o in world.module.trainer.optimizers for g in o.param_groups for p in g["params"]}
    loose = [p for p in world.params if id(p) not in held]
    undo: Any = None
    if how == "not an optimizer":
        groups = data.draw(st.sampled_from([None, [], [{}], [{"lr": 0.1}], ({"params": 3},), "groups"]), label="groups")
        # often right at the 80-character cut (79, 80, 81...), where an off-by-one would show
        near_the_cut = st.integers(76, 84).flatmap(lambda n: st.text(min_size=n, max_size=n))
        text = data.draw(st.one_of(st.none(), st.text(max_size=120), near_the_cut), label="repr")
        bad: Any = _NotAnOptimizer(groups, text)
        if isinstance(groups, list) and groups == []:
            bad = _NotAnOptimizer(None, text)  # an empty list of groups would be an optimizer of nothing
        error, expected = TypeError, ["expects an optimizer", type(bad).__qualname__]
        if text is not None:
            expected.append(text if len(text) <= 80 else text[:77] + "...")
    elif how == "stranger":
        fresh = [torch.nn.Parameter(torch.ones(n)) for n in (1, 2, 3)]
        # a parameter of the module that no optimizer holds: registered now, so that every world has
        # one (a name to find among the module's parameters, besides the loose ones some worlds have)
        world.module.register_parameter("extra", torch.nn.Parameter(torch.ones(2)))
        names = {}
        for name, p in world.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), name)  # a tied parameter by its first name, as named_parameters() gives it
        named = [world.module.extra, *loose]
        strangers = data.draw(st.lists(st.one_of(st.sampled_from(named), st.sampled_from(fresh)), min_size=1,
                                       max_size=2, unique_by=id), label="the strangers")
        bad = torch.optim.SGD([next(p for p in world.params if id(p) in held), *strangers], lr=0.1)
        stranger = strangers[0]  # the first is named
        error = ValueError
        expected = [repr(names[id(stranger)]) if id(stranger) in names else f"unnamed parameter of shape "
                    f"{tuple(stranger.shape)}", "none of trainer.optimizers"]
    elif how == "the trainer's not an optimizer":
        j = data.draw(st.integers(0, len(world.opts) - 1), label="which optimizer")
        group = world.module.trainer.optimizers[j].param_groups[0]
        undo = (group, group["params"])
        group["params"] = data.draw(st.sampled_from([3, None]), label="its params")
        bad = world.opts[data.draw(st.integers(0, len(world.opts) - 1), label="toggled")]
        error, expected = TypeError, [f"trainer.optimizers[{j}] is not an optimizer"]
    else:
        item = data.draw(st.sampled_from([7, "w", None, 1.5]), label="the non-tensor")
        if how == "non-tensor in the trainer's":
            j = data.draw(st.integers(0, len(world.opts) - 1), label="which optimizer")
            params = world.module.trainer.optimizers[j].param_groups[0]["params"]
            world.module.trainer.optimizers[j].param_groups[0]["params"] = [*params, item]
            undo = (world.module.trainer.optimizers[j].param_groups[0], params)
            bad = world.opts[data.draw(st.integers(0, len(world.opts) - 1), label="toggled")]
        else:
            bad = torch.optim.SGD(world.params[:1], lr=0.1)
            bad.param_groups[0]["params"].append(item)
        error, expected = TypeError, [f"builtins.{type(item).__name__} ({item!r}) where a parameter"]
    before, record = _rg(world), world.module.__dict__.get("_param_requires_grad_state")
    try:
        world.module.toggle_optimizer(bad)
    except error as exc:
        message = str(exc)
        assert all(part in message for part in expected), (expected, message)
        assert "nothing was changed" in message
    else:
        raise AssertionError(f"{how}: toggle_optimizer accepted it")
    assert _rg(world) == before, "a refused optimizer changed requires_grad"
    assert world.module.__dict__.get("_param_requires_grad_state") is record and not _open(world)
    if undo is not None:
        undo[0]["params"] = undo[1]
    k = data.draw(st.integers(0, len(world.opts) - 1), label="next block")
    expected_world = build_world(bare, flavour)
    ManualDriver.for_flavour(flavour).toggle(expected_world, k)
    with world.module.toggle_optimizer(world.opts[k], zero_grad=False, step=False):
        assert _rg(world) == _rg(expected_world)
    assert _rg(world) == before
