"""Stateful: a ``RuleBasedStateMachine`` over toggles, blocks, nesting and faults.

Blocks are driven through ``__enter__``/``__exit__`` exactly as the ``with`` statement calls them, so a
block can stay open across steps and the machine can interleave anything inside it. The reference
model runs beside the real module; invariants are checked after every step.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MethodType
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_hostile import Interrupter

import toggleshim  # noqa: F401
from toggleshim import _block, _toggle
from toggleshim.testing import InjectedFault, ToggleModel, WorldSpec, build_world, installed_flavours, worlds
from toggleshim.testing.model import FLAG_DEFAULTS, expected_calls, expected_sync, lightning_toggle
from toggleshim.testing.specs import SYNC_FAULTS


def _params(opt: Any) -> list[Any]:
    return [p for g in opt.param_groups for p in g["params"]]


def _edit(group: dict[str, Any], edit: Callable[[list[Any]], Any]) -> Any:
    """Apply ``edit`` to a param group's ``"params"``: in place when it is a list (the edit a toggle's
    cache must notice), else as users must edit a tuple: a new one of the same type put in its place."""
    params = group["params"]
    if isinstance(params, list):
        return edit(params)
    edited = list(params)
    result = edit(edited)
    group["params"] = type(params)(edited)
    return result


@dataclass
class _Open:
    toggle: Any
    frame: Any
    k: int
    step: bool
    sync_grad: bool
    fault: str | None  # "sync_exit": leaving its no-sync context fails, however the block closes


class ToggleMachine(RuleBasedStateMachine):
    """One world on a stand-in trainer; blocks stay open across rules."""

    flavour = "lightning.pytorch"

    # Two optimizers at least: what happens between optimizers is what toggling is about (a single
    # optimizer's worlds are in test_equivalence).
    @initialize(spec=worlds(nesting=False, faults=False, max_ops=1).filter(lambda spec: len(spec.optimizers) > 1))
    def build(self, spec: WorldSpec) -> None:
        # the drawn kinds of optimizer object (torch, or LightningOptimizer) and the stand-in strategy
        self.world = build_world(replace(spec, program=()), self.flavour)
        self.model = ToggleModel(self.world.optimizers_spec, [p.requires_grad for p in self.world.params])
        self.blocks: list[_Open] = []
        self.ever_frozen = {i for i, p in enumerate(self.world.params) if not p.requires_grad}
        self.calls: list[tuple[str, int]] = []
        self.sync: list[str] = []  # the model's block_backward_sync entries and exits
        self.steps_through_wrappers = 0  # the model's global step
        self.user_changed_inside = False
        self.flat_statement: int | None = None
        self.used: list[Any] = []  # toggles whose block has closed

    # -- helpers --
    def k(self, data: st.DataObject) -> int:
        return data.draw(st.integers(0, len(self.world.opts) - 1), label="optimizer")

    def torch_optimizers(self) -> list[Any]:
        """The torch optimizers behind ``world.opts`` (whose parameter lists the edits change)."""
        return [getattr(o, "_optimizer", o) for o in self.world.opts]

    def pending_statement(self) -> bool:
        return bool(self.model.record) and not self.model.stack

    # -- rules --
    @rule(data=st.data(), zero_grad=st.booleans(), step=st.booleans(), sync_grad=st.booleans(),
          fail=st.sampled_from([None, None, "zero_grad", *SYNC_FAULTS]))
    def open_block(self, data: st.DataObject, zero_grad: bool, step: bool, sync_grad: bool, fail: str | None) -> None:
        """A block opens; ``fail``: its zero_grad fails, or its no-sync context (``sync_grad=False``)
        cannot be made or entered, or later cannot be left (``"sync_exit"``, whatever closes it)."""
        k = self.k(data)
        if self.pending_statement():
            return  # a block inside a pending statement toggle nests in it: test_equivalence.py draws it
        if (fail in SYNC_FAULTS and sync_grad) or (fail == "zero_grad" and not zero_grad):
            fail = None  # a fault of a call the block does not make
        toggle = self.world.module.toggle_optimizer(
            self.world.opts[k], zero_grad=zero_grad, step=step, sync_grad=sync_grad
        )
        frame = self.model.toggle(k)
        self.model.enter(frame, sync_grad)
        self.sync += expected_sync(sync_grad, True, fail)
        self.calls += expected_calls(k, zero_grad, step, None, fail)
        strategy = self.world.strategy
        assert strategy is not None
        if fail == "zero_grad":
            self.world.fault = ("zero_grad", k)
        elif fail is not None:
            strategy.fault = fail  # taken by the block's block_backward_sync() call
        if fail not in (None, "sync_exit"):
            try:
                toggle.__enter__()
            except InjectedFault as exc:
                assert exc is self.world.raised[-1]
                self.model.exit(frame)
                self.sync += expected_sync(sync_grad, False, fail)
                return
            raise AssertionError(f"a failing {fail} did not propagate out of __enter__")
        assert toggle.__enter__() is self.world.opts[k]
        assert strategy.fault is None, "the block did not make its no-sync context"
        self.model.start_body(frame)
        self.blocks.append(_Open(toggle, frame, k, step, sync_grad, fail))

    @precondition(lambda self: self.blocks)
    @rule(how=st.sampled_from(["clean", "error", "interrupt", "failing step"]))
    def close_block(self, how: str) -> None:
        """The innermost block closes: cleanly, with the body's error or interrupt, or its step fails.
        The exception that comes out is the first (the step's before the no-sync exit's; the body's is
        never replaced, ``__exit__`` returns False)."""
        top = self.blocks.pop()
        sync_error = top.fault == "sync_exit"
        refused = how in ("clean", "failing step") and self.model.refuses_step(top.frame, top.step, True)
        if refused:  # its optimizer stepped inside it (a nested block over it, named so): no second step
            with pytest.raises(RuntimeError, match=r"a nested `with self.toggle_optimizer\(opt\):` over the same"):
                top.toggle.__exit__(None, None, None)
        elif how == "clean":
            try:
                assert top.toggle.__exit__(None, None, None) is False
            except InjectedFault as exc:
                assert sync_error and exc is self.world.raised[-1], "not the no-sync exit's error came out"
            else:
                assert not sync_error, "a failing exit of the no-sync context did not propagate"
            if top.step:
                self.calls.append(("step", top.k))
                self.steps_through_wrappers += top.k in self.world.wrapped
        elif how == "failing step":
            self.world.fault = ("step", top.k)
            raised = len(self.world.raised)
            try:
                top.toggle.__exit__(None, None, None)
            except InjectedFault as exc:
                assert exc is self.world.raised[raised], "not the first error came out"
                assert top.step or sync_error
                self.calls += [("step", top.k)] if top.step else []
            else:
                assert not top.step and not sync_error, "a failing step did not propagate out of __exit__"
            self.world.fault = None
        else:
            exc = InjectedFault("body") if how == "error" else KeyboardInterrupt()
            assert top.toggle.__exit__(type(exc), exc, None) is False  # never swallowed, never replaced
        self.model.exit(top.frame)
        if how == "clean" and top.step and not refused:
            self.model.stepped(top.k)  # an enclosing block over the same optimizer has seen it step
        self.sync += expected_sync(top.sync_grad, False, top.fault)
        assert repr(top.toggle).startswith("<toggleshim.Toggle closed"), repr(top.toggle)
        self.used = [*self.used[-2:], top.toggle]

    @precondition(lambda self: self.blocks)
    @rule(data=st.data(), how=st.sampled_from(["getattr", "hasattr", "twice"]))
    def look_up_an_open_blocks_exit(self, data: st.DataObject, how: str) -> None:
        """``__exit__`` looked up on an open block and dropped (a debugger, ``inspect``, an
        ``ExitStack`` reading it): the block stays open; only its own ``with`` closes it."""
        toggle = data.draw(st.sampled_from(self.blocks), label="block").toggle
        if how == "hasattr":
            assert hasattr(toggle, "__exit__")
        else:
            for _ in range(1 + (how == "twice")):
                getattr(toggle, "__exit__")  # noqa: B009  (the lookup is the point)
        assert repr(toggle).startswith("<toggleshim.Toggle open"), repr(toggle)

    @precondition(lambda self: self.blocks or self.used)
    @rule(data=st.data())
    def enter_a_used_toggle(self, data: st.DataObject) -> None:
        """``with t:`` again on a toggle whose block is open or has closed: a RuntimeError that says
        a toggle is single-use, and nothing changes (the invariants)."""
        toggle = data.draw(st.sampled_from([*(b.toggle for b in self.blocks), *self.used]), label="toggle")
        try:
            toggle.__enter__()
        except RuntimeError as exc:
            assert "already used" in str(exc) and "nothing was changed" in str(exc), str(exc)
        else:
            raise AssertionError(f"{toggle!r} was entered twice")

    @precondition(lambda self: not self.blocks and not self.pending_statement())
    @rule(data=st.data(), line=st.integers(1, 120), sync_grad=st.booleans())
    def interrupted_block(self, data: st.DataObject, line: int, sync_grad: bool) -> None:
        """Ctrl-C at the ``line``-th line the package runs during a block (120: past the end of most
        blocks, so that some complete). The interrupt comes out unchanged; ``requires_grad`` is the
        state before or, interrupted right after the toggle, Lightning's toggled state (the user then
        untoggles); nothing stays open; gradient sync is back on."""
        k = self.k(data)
        before = [p.requires_grad for p in self.world.params]
        toggled = list(self.model.rg)
        toggled_record = lightning_toggle(toggled, self.model.optimizers, k)
        record_before = self.model.record
        with Interrupter(line) as inter:
            try:
                with self.world.module.toggle_optimizer(
                    self.world.opts[k], zero_grad=False, step=False, sync_grad=sync_grad
                ):
                    pass
            except KeyboardInterrupt as caught:
                assert caught is inter.raised
        if inter.raised is None:  # the block completed
            frame = self.model.toggle(k)
            self.model.enter(frame, sync_grad)
            self.model.exit(frame)
            self.sync += expected_sync(sync_grad, entry=True) + expected_sync(sync_grad, entry=False)
            return
        after = [p.requires_grad for p in self.world.params]
        assert after in (before, toggled), (inter.raised, before, toggled, after)
        # The record as well: untouched or emptied (as Lightning's untoggle leaves it), or, interrupted
        # right after the toggle, exactly Lightning's toggle's record.
        index = {id(p): i for i, p in enumerate(self.world.params)}
        raw = self.world.module.__dict__.get("_param_requires_grad_state")
        record = None if raw is None else {index[id(p)]: v for p, v in raw.items()}
        assert record in (record_before, {}) or (after == toggled and record == toggled_record), (
            inter.raised, record_before, record)
        if after != before:
            self.world.module.untoggle_optimizer(self.world.opts[k])
            assert [p.requires_grad for p in self.world.params] == before
        state = _toggle.state_if_any(self.world.module)
        assert state is None or not state.stack, "a block stayed open"
        strategy = self.world.strategy
        assert strategy is not None and strategy.blocked == 0
        self.sync = list(strategy.sync_log)  # entered or not, depending on the line: balanced is checked
        assert self.sync.count("enter") == self.sync.count("exit")
        raw = self.world.module.__dict__.get("_param_requires_grad_state")
        self.model.record = None if raw is None else {index[id(p)]: v for p, v in raw.items()}

    @precondition(lambda self: not self.pending_statement())
    @rule(data=st.data(), in_flight=st.booleans())
    def exit_without_enter(self, data: st.DataObject, in_flight: bool) -> None:
        """``__exit__`` on a toggle whose block never started: with an exception in flight it returns
        False (never replaces it); without, a RuntimeError says the block is not open. The toggle
        stays a statement toggle, which its untoggle closes."""
        k = self.k(data)
        toggle = self.world.module.toggle_optimizer(self.world.opts[k])
        self.model.toggle(k)
        if in_flight:
            exc = InjectedFault("in flight")
            assert toggle.__exit__(InjectedFault, exc, None) is False
        else:
            try:
                toggle.__exit__(None, None, None)
            except RuntimeError as exc:
                assert "not open" in str(exc)
            else:
                raise AssertionError("__exit__ of a block never entered did not refuse")
        self.world.module.untoggle_optimizer(self.world.opts[k])
        self.model.untoggle(k)

    @rule(data=st.data(), flag=st.sampled_from(list(FLAG_DEFAULTS)), value=st.sampled_from([1, 0, None, "yes"]))
    def bad_flag(self, data: st.DataObject, flag: str, value: object) -> None:
        """A flag that is not a bool: a TypeError naming it, and nothing changes (the invariants)."""
        try:
            self.world.module.toggle_optimizer(self.world.opts[self.k(data)], **{flag: value})
        except TypeError as exc:
            assert f"{flag} must be True or False" in str(exc)
        else:
            raise AssertionError(f"{flag}={value!r} was accepted")

    @rule(generation=st.sampled_from([0, 1, 2]))
    def collect(self, generation: int) -> None:
        """A garbage collection, as the training loop's may run between any two lines: toggleshim's
        cache of the module names its layout by ids, watched weakly, so it holds nothing a collection
        could free; while every item is alive it stays, and the next toggle is as exact as ever (the
        invariants)."""
        state = _toggle.state_if_any(self.world.module)
        cached = None if state is None else (state.ids, dict(state.plans))
        gc.collect(generation)
        if state is not None and cached is not None:
            assert state.ids == cached[0] and state.plans == cached[1], "a collection dropped the cache"

    @rule(data=st.data())
    def statement_toggle(self, data: st.DataObject) -> None:
        if self.pending_statement():
            return  # Lightning's own statement nesting freezes for good; the shim keeps it exact
        k = self.k(data)
        self.world.module.toggle_optimizer(self.world.opts[k])
        self.model.toggle(k)
        if not self.model.stack:
            self.flat_statement = k

    def open_statement(self) -> int | None:
        """The optimizer of the statement toggle an ``untoggle_optimizer`` would pair with, if any."""
        stack = self.model.stack
        if stack and not stack[-1].entered:
            return int(stack[-1].k)
        return self.flat_statement if self.pending_statement() else None

    @precondition(lambda self: self.open_statement() is not None)
    @rule()
    def statement_untoggle(self) -> None:
        # Always the pair of the open statement toggle: a mismatched untoggle is Lightning's own
        # (exactly reproduced) semantics, which the model's flat layer covers in test_equivalence.
        k = self.open_statement()
        assert k is not None
        self.world.module.untoggle_optimizer(self.world.opts[k])
        self.model.untoggle(k)

    @rule(data=st.data(), value=st.booleans())
    def set_requires_grad(self, data: st.DataObject, value: bool) -> None:
        i = data.draw(st.integers(0, len(self.world.params) - 1), label="parameter")
        self.world.params[i].requires_grad_(value)
        self.model.set_requires_grad(i, value)
        self.user_changed_inside = self.user_changed_inside or bool(self.model.stack)
        if not value:
            self.ever_frozen.add(i)

    @rule(data=st.data(), how=st.sampled_from(["move", "replace", "add group", "remove", "reorder"]))
    def edit_optimizers(self, data: st.DataObject, how: str) -> None:
        """Edit the optimizers' parameter lists in place, as a user may between or inside blocks.

        A toggle caches what it learnt about the layout; after an edit it must see the new one.
        """
        opts = self.torch_optimizers()
        k = self.k(data)
        groups = opts[k].param_groups
        param = self.world.params[data.draw(st.integers(0, len(self.world.params) - 1), label="parameter")]
        filled = [g for g in groups if g["params"]]
        # Never a parameter twice in one optimizer: torch refuses it (add_param_group), and its steps
        # fail on it (RMSprop's state made under one group's momentum, read under another's).
        if how == "move" and filled:
            source = data.draw(st.sampled_from(filled))
            taken = _edit(source, lambda lst: lst.pop())
            into = opts[self.k(data)]
            if any(taken is q for q in _params(into)):  # held there already: it goes back where it was
                _edit(source, lambda lst: lst.append(taken))
            else:
                target = into.param_groups[0]
                at = data.draw(st.integers(0, len(target["params"])))
                _edit(target, lambda lst: lst.insert(at, taken))
        elif how == "replace" and filled and not any(param is q for q in _params(opts[k])):
            target = data.draw(st.sampled_from(filled))
            at = data.draw(st.integers(0, len(target["params"]) - 1))
            _edit(target, lambda lst: lst.__setitem__(at, param))
        elif how == "add group" and not any(param is q for q in _params(opts[k])):
            # torch refuses a parameter the optimizer holds; an lr of its own: before torch 2.2, SGD made with
            # per-group lrs has no default lr for a new group
            opts[k].add_param_group({"params": [param], "lr": opts[k].param_groups[0]["lr"]})
        elif how == "remove" and filled:
            target = data.draw(st.sampled_from(filled))
            at = data.draw(st.integers(0, len(target["params"]) - 1))
            _edit(target, lambda lst: lst.pop(at))
        elif how == "reorder":
            if len(groups) > 1:
                groups.reverse()
            else:
                _edit(groups[0], lambda lst: lst.reverse())
        self.edited(opts)

    @precondition(lambda self: self.blocks)
    @rule(data=st.data(), into_the_block=st.booleans())
    def take_a_parameter_away_inside_a_block(self, data: st.DataObject, into_the_block: bool) -> None:
        """The edit that matters most inside a block: a parameter the toggle froze leaves another
        optimizer (dropped, or moved into the block's optimizer). The block's exit must be Lightning's
        untoggle over the edited lists (which leaves it frozen), not over the lists it toggled."""
        opts = self.torch_optimizers()
        top = self.blocks[-1].k
        others = [j for j, o in enumerate(opts) if j != top and _params(o)]
        if not others:
            return
        j = data.draw(st.sampled_from(others), label="from optimizer")
        source = data.draw(st.sampled_from([g for g in opts[j].param_groups if g["params"]]))
        at = data.draw(st.integers(0, len(source["params"]) - 1))
        taken = _edit(source, lambda lst: lst.pop(at))
        if into_the_block and not any(taken is q for q in _params(opts[top])):
            _edit(opts[top].param_groups[0], lambda lst: lst.append(taken))
        self.edited(opts)

    def edited(self, opts: list[Any]) -> None:
        """Tell the model the optimizers' new parameter lists."""
        index = {id(p): i for i, p in enumerate(self.world.params)}
        before = self.world.optimizers_spec
        self.world.optimizers_spec = [[index[id(p)] for p in _params(o)] for o in opts]
        self.model.set_optimizers(self.world.optimizers_spec)
        if self.model.stack or self.model.record:
            # A parameter that changes optimizers while a toggle is open may legitimately stay frozen
            # (Lightning's untoggle restores the other optimizers' parameters as they are at the
            # untoggle), and so may one frozen now; the model still says exactly what happens.
            def held(spec: list[list[int]], i: int) -> set[int]:
                return {k for k, params in enumerate(spec) if i in params}

            moved = {i for i in range(len(self.world.params)) if held(before, i) != held(self.world.optimizers_spec, i)}
            self.ever_frozen |= moved | {i for i, p in enumerate(self.world.params) if not p.requires_grad}
            self.user_changed_inside = True

    @precondition(lambda self: bool(self.model.record))
    @rule(data=st.data(), how=st.sampled_from(["flip", "delete", "replace a key"]))
    def edit_the_record(self, data: st.DataObject, how: str) -> None:
        """Edit ``_param_requires_grad_state`` in place, inside a block or before a statement untoggle:
        Lightning's untoggle restores what the record holds at the untoggle, and so must a block's exit.

        The edited entry is preferably one the untoggle restores (a parameter of another optimizer).
        """
        record = self.world.module.__dict__["_param_requires_grad_state"]
        index = {id(p): i for i, p in enumerate(self.world.params)}
        top = self.model.stack[-1].k if self.model.stack else self.flat_statement
        restored = {i for j, params in enumerate(self.world.optimizers_spec) if j != top for i in params}
        keys = list(record)
        param = data.draw(st.sampled_from([p for p in keys if index[id(p)] in restored] or keys), label="entry")
        i = index[id(param)]
        self.ever_frozen.add(i)  # the untoggle may now leave it frozen, exactly as Lightning's would
        if how == "flip":
            record[param] = not record[param]
            self.model.edit_record(i, record[param])
            return
        del record[param]
        self.model.edit_record(i, None)
        absent = [p for p in self.world.params if p is not param and not any(p is q for q in record)]
        if how == "replace a key" and absent:  # same length, other keys: only identity tells
            other = data.draw(st.sampled_from(absent), label="new entry")
            record[other] = False
            self.model.edit_record(index[id(other)], False)
            self.ever_frozen.add(index[id(other)])

    @rule(data=st.data())
    def backward(self, data: st.DataObject) -> None:
        terms = data.draw(st.lists(st.integers(0, len(self.world.terms) - 1), max_size=3, unique=True))
        loss = sum((self.world.terms[t]() for t in terms), torch.zeros(()))
        if loss.requires_grad:
            loss.backward()

    # -- invariants --
    @invariant()
    def requires_grad_matches_model(self) -> None:
        got = [p.requires_grad for p in self.world.params]
        assert got == self.model.rg, f"requires_grad {got}, model {self.model.rg}"

    @invariant()
    def record_matches_model(self) -> None:
        index = {id(p): i for i, p in enumerate(self.world.params)}
        raw = self.world.module.__dict__.get("_param_requires_grad_state", {})
        assert [(index[id(p)], v) for p, v in raw.items()] == list((self.model.record or {}).items())

    @invariant()
    def inside_a_block_only_its_optimizer_trains(self) -> None:
        if not self.model.stack:
            self.user_changed_inside = False
            return
        if self.user_changed_inside:  # the user may unfreeze anything inside; the model covers that
            return
        k = self.model.stack[-1].k
        others = set(self.model.managed) - set(self.world.optimizers_spec[k])
        assert not any(self.world.params[i].requires_grad for i in others)

    @invariant()
    def outside_every_block_nothing_stays_frozen_by_toggling(self) -> None:
        if self.model.stack or self.model.record:
            return
        for i, p in enumerate(self.world.params):
            assert p.requires_grad or i in self.ever_frozen, f"parameter {i} left frozen by toggling"

    @invariant()
    def optimizer_calls_follow_the_exit_paths(self) -> None:
        assert self.world.calls == self.calls

    @invariant()
    def gradient_sync_is_blocked_exactly_inside_sync_grad_false_blocks(self) -> None:
        strategy = self.world.strategy
        assert strategy is not None
        assert (strategy.blocked > 0) == self.model.sync_blocked(), (strategy.blocked, self.model.stack)
        assert strategy.sync_log == self.sync, (strategy.sync_log, self.sync)

    @invariant()
    def steps_through_lightning_optimizers_run_the_hooks_and_count(self) -> None:
        strategy = self.world.strategy
        assert strategy is not None
        assert strategy.global_step == self.steps_through_wrappers
        steps = [k for name, k in self.world.reached if name == "step" and k in self.world.wrapped]
        assert strategy.hooks == [(hook, k) for k in steps for hook in ("before_step", "after_step")]

    @invariant()
    def a_step_watch_on_an_optimizer_exactly_while_a_block_over_it_steps_on_exit(self) -> None:
        from torch.optim import optimizer as torch_optimizer

        assert not any(getattr(h, "__self__", None).__class__ is _block.Toggle
                       for h in torch_optimizer._global_optimizer_post_hooks.values()), "a process-wide watch"
        for k, inner in enumerate(self.torch_optimizers()):
            watching, closed = [], 0  # the step watches on top of ``step`` on the instance
            watch = vars(inner).get("step")
            while isinstance(watch, MethodType) and watch.__func__.__qualname__.startswith("Toggle._watch_steps"):
                if watch.__func__.closed:
                    closed += 1
                else:
                    cell = dict(zip(watch.__func__.__code__.co_freevars, watch.__func__.__closure__ or ()))
                    watching.append(id(cell["block"].cell_contents()))
                watch = watch.__func__.covers
            stepping = sorted(id(b.toggle) for b in self.blocks if b.k == k and b.step)
            assert sorted(watching) == stepping, f"optimizer {k}: step watches of {watching}, blocks {stepping}"
            assert stepping or not closed, f"optimizer {k}: {closed} step watches of closed blocks left on it"

    def teardown(self) -> None:
        while getattr(self, "blocks", None):  # leave no block open on the module
            top = self.blocks.pop()
            refused = self.model.refuses_step(top.frame, top.step, True)
            try:
                top.toggle.__exit__(None, None, None)
            except InjectedFault:
                assert top.fault == "sync_exit"
            except RuntimeError as exc:  # its optimizer stepped inside it: no second step
                assert refused and "would step twice" in str(exc)
            self.model.exit(top.frame)
            if top.step and not refused:
                self.model.stepped(top.k)


# One machine per flavour under test (``TOGGLESHIM_FLAVOUR`` narrows it, as everywhere).
for _flavour in installed_flavours():
    _name = "Test" + "".join(part.title() for part in _flavour.replace(".", "_").split("_")) + "ToggleMachine"
    _case = type(_name, (ToggleMachine,), {"flavour": _flavour}).TestCase
    _case.settings = settings(settings.default, stateful_step_count=25)  # 25 steps: 3-4 nested blocks deep
    globals()[_name] = _case
del _case
