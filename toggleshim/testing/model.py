"""The reference model: toggling semantics in plain Python, written from the documentation alone.

Parameters are numbered ``0..n-1``; an optimizer is the list of parameter numbers it holds (in
``param_groups`` order, as Lightning iterates). The model knows nothing of torch or of the shim; the
property suite checks the shim *and* Lightning's own methods against it, so a Lightning release that
changes toggling is caught even though the two would change together.

Two layers:

* :func:`lightning_toggle` / :func:`lightning_untoggle`: Lightning's flat methods (2.0 to 2.6).
* :class:`ToggleModel`: the shim: statement toggles, blocks, nesting, and every exit path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "FLAG_DEFAULTS",
    "Frame",
    "ToggleModel",
    "block_flags",
    "expected_calls",
    "expected_hooks",
    "expected_sync",
    "lightning_toggle",
    "lightning_untoggle",
]

Optimizers = list[list[int]]


class Overrides(Protocol):
    """What the model reads of a class's overrides (``specs.Overrides`` draws them; the model does
    not import the specs, which take the flags' defaults from here)."""

    @property
    def toggle(self) -> str | None: ...
    @property
    def untoggle(self) -> str | None: ...
    @property
    def toggle_sets(self) -> tuple[tuple[int, bool], ...]: ...
    @property
    def untoggle_sets(self) -> tuple[tuple[int, bool], ...]: ...
    @property
    def super_flags(self) -> tuple[tuple[str, bool], ...]: ...

#: The block's flags and their documented defaults (README, "Semantics"), written here and not taken
#: from the code under test: a default changed there is then a difference the harness sees.
FLAG_DEFAULTS: dict[str, bool] = {"zero_grad": True, "step": True, "sync_grad": True}


def block_flags(passed: dict[str, bool], entry: str, overrides: Overrides | None = None) -> dict[str, bool]:
    """The flags a block runs with (README, "Semantics"): those passed to the call, over the defaults.
    Where the module's ``toggle_optimizer`` is the user's and passes flags of its own to ``super()``,
    those are the block's flags through every entry point; the flags passed to ``toggleshim.toggle``
    (``entry`` "toggle", "Toggle") win over them, while a call of the method itself (``entry``
    "method") hands its flags to the user's method, whose own win."""
    own = dict(overrides.super_flags) if overrides is not None and overrides.toggle in ("super", "none") else {}
    if entry == "method":
        return {**FLAG_DEFAULTS, **passed, **own}
    return {**FLAG_DEFAULTS, **own, **passed}


def lightning_toggle(
    rg: list[bool], optimizers: Optimizers, k: int, opt_params: list[int] | None = None
) -> dict[int, bool]:
    """``LightningModule.toggle_optimizer``: freeze every managed parameter, give the toggled one's back.

    Returns the record Lightning stores as ``_param_requires_grad_state`` (first-seen order).
    ``opt_params`` is the toggled optimizer's parameters when it is not one of ``optimizers``.
    """
    record: dict[int, bool] = {}
    for params in optimizers:
        for i in params:
            if i not in record:
                record[i] = rg[i]
    for i in record:
        rg[i] = False
    for i in optimizers[k] if opt_params is None else opt_params:
        rg[i] = record[i]
    return record


def lightning_untoggle(rg: list[bool], record: dict[int, bool], optimizers: Optimizers, k: int | None) -> None:
    """``LightningModule.untoggle_optimizer``: the *other* optimizers' parameters get their record back.

    A parameter only ``k`` holds keeps whatever the user set inside; one shared with another optimizer
    is restored. ``k=None`` is an optimizer not among ``optimizers`` (everything is restored).
    """
    for j, params in enumerate(optimizers):
        if j != k:
            for i in params:
                if i in record:
                    rg[i] = record[i]


def expected_calls(
    k: int, zero_grad: bool, step: bool, body_completed: bool | None, fault: str | None = None
) -> list[tuple[str, int]]:
    """The optimizer calls a block makes: ``zero_grad`` on entry (``body_completed=None``: the entry
    alone), ``step`` on exit only after a clean body (``body_completed``: the exit alone). No
    ``zero_grad`` when the no-sync context could not be entered (``fault``): it comes after."""
    if body_completed is None:
        return [("zero_grad", k)] if zero_grad and fault not in ("sync_call", "sync_enter") else []
    return [("step", k)] if step and body_completed else []


def expected_sync(sync_grad: bool, entry: bool, fault: str | None = None) -> list[str]:
    """The strategy's ``block_backward_sync()`` a block uses: with ``sync_grad=False`` it is entered
    once when the block starts (``entry``) and left once when it ends, by any path, exceptions
    included, and once even when leaving it fails (``fault="sync_exit"``: as a ``with`` statement);
    a context that could not be made or entered (``"sync_call"``, ``"sync_enter"``) is never left;
    with ``sync_grad=True`` never."""
    if sync_grad or fault in ("sync_call", "sync_enter"):
        return []
    return ["enter"] if entry else ["exit"]


def expected_hooks(k: int, wrapped: bool, step_ran: bool) -> list[tuple[str, int]]:
    """A step through a ``LightningOptimizer`` runs the loop's hooks around the update
    (``_on_before_step``, ``_on_after_step``: one global step); a torch optimizer's step runs none.
    ``step_ran``: the wrapper's ``step`` was called (a fault injected before it: not)."""
    return [("before_step", k), ("after_step", k)] if wrapped and step_ran else []


@dataclass(eq=False)
class Frame:
    """One toggle: a block (``entered``) or a statement toggle made inside a block (``nested``)."""

    k: int
    nested: bool
    user: dict[int, bool]  # the user's view this toggle was taken from (= Lightning's record when flat)
    entry: list[bool] = field(default_factory=list)  # requires_grad found on a nested toggle
    previous_record: dict[int, bool] | None = None
    managed: list[int] = field(default_factory=list)  # the parameters the trainer's optimizers held then
    live: set[int] = field(default_factory=set)  # the toggled optimizer's parameters then
    entered: bool = False
    closed: bool = False
    sync_grad: bool = True  # a block's flag: False blocks gradient sync while its body runs
    in_body: bool = False  # the block's entry (zero_grad) is done: its body runs
    # flat, toggled while a statement toggle was open: (its record, its optimizer's parameters); the
    # block nests inside it once entered (``ToggleModel.nest``)
    outer: tuple[dict[int, bool], set[int], list[bool]] | None = None
    stepped: bool = False  # the block's optimizer stepped while the block was open
    # toggleshim.toggle over a user's toggle_optimizer that returns no toggle: the module's own
    # sequence around it (zero_grad; body; step; the module's untoggle_optimizer)
    own_block: bool = False


class ToggleModel:
    """The shim's documented semantics over numbered parameters.

    ``rg`` is every parameter's ``requires_grad``; ``record`` mirrors ``_param_requires_grad_state``
    (``None`` before any toggle, like a fresh module).
    """

    def __init__(self, optimizers: Optimizers, requires_grad: list[bool], lightning: bool = False,
                 overrides: Overrides | None = None) -> None:
        self.optimizers = [list(p) for p in optimizers]
        self.rg = list(requires_grad)
        self.record: dict[int, bool] | None = {}
        self.stack: list[Frame] = []
        # ``lightning``: the model of Lightning's own methods driven by the manual sequence (a block
        # inside an open statement toggle is flat there, as every toggle is)
        self.lightning = lightning
        self.nested_seen = False  # a toggle took the shim's nesting rule (no manual sequence to compare)
        # the last flat toggle's record (the object) and which of its keys were its optimizer's
        self.flat_record: dict[int, bool] | None = None
        self.flat_own: list[bool] = []
        self.overrides = overrides  # the module's class overrides toggle/untoggle_optimizer
        self.own_blocks: list[Frame] = []  # open blocks running the module's own sequence

    @property
    def managed(self) -> list[int]:
        seen: list[int] = []
        for params in self.optimizers:
            seen.extend(i for i in params if i not in seen)
        return seen

    def set_requires_grad(self, i: int, value: bool) -> None:
        self.rg[i] = value

    def set_optimizers(self, optimizers: Optimizers) -> None:
        """The user edits the optimizers' parameter lists (``add_param_group``, moving parameters).

        Open toggles keep what they recorded; a flat exit is Lightning's untoggle over the new lists.
        """
        self.optimizers = [list(p) for p in optimizers]

    def replace_record(self) -> None:
        """The user replaces ``_param_requires_grad_state`` by another object with the same entries."""
        if self.record is not None:
            self.record = dict(self.record)

    def edit_record(self, i: int, value: bool | None) -> None:
        """The user edits ``_param_requires_grad_state`` in place: ``record[i] = value`` (``None``: delete).

        Lightning's untoggle (a flat block's exit included) restores what the record holds then.
        """
        assert self.record is not None
        if value is None:
            self.record.pop(i, None)
        else:
            self.record[i] = value

    # -- the module's own methods (a subclass's overrides) --------------------------------------

    def _write(self, sets: tuple[tuple[int, bool], ...]) -> None:
        for i, value in sets:
            if i < len(self.rg):
                self.rg[i] = value

    def toggle_call(self, k: int) -> Frame | None:
        """``module.toggle_optimizer(opt[k])``: the override (if any) around ``super()``'s toggle, or
        around Lightning's own (then toggleshim's state knows nothing of it)."""
        ov = self.overrides
        frame = None
        if ov is not None and ov.toggle == "original" and not self.lightning:
            self.record = lightning_toggle(self.rg, self.optimizers, k)
        elif ov is None or ov.toggle != "own":
            frame = self.toggle(k)
        if ov is not None and ov.toggle:
            self._write(ov.toggle_sets)
        return frame

    def untoggle_call(self, k: int) -> None:
        """``module.untoggle_optimizer(opt[k])`` as a statement: the override around ``super()``'s, or
        around Lightning's own (toggleshim's open statement toggle, if any, stays open)."""
        ov = self.overrides
        if ov is not None and ov.untoggle == "original" and not self.lightning:
            self._lightnings_untoggle(k)
        elif ov is None or ov.untoggle != "own":
            self.untoggle(k)
        if ov is not None and ov.untoggle:
            self._write(ov.untoggle_sets)

    def _lightnings_untoggle(self, k: int) -> None:
        lightning_untoggle(self.rg, self.record or {}, self.optimizers, k)
        self.record = {}

    def block_toggle(self, k: int) -> Frame:
        """A block's toggle (every entry point). An override that returns None (``toggleshim.toggle``
        calls it) has only forgotten to return what its ``super()`` made: that toggle is the block,
        as where it is returned. Where the override makes no toggle of toggleshim's (it never calls
        ``super()``; or the manual sequence, Lightning's own methods), the block is the module's own
        sequence around the toggle it made."""
        frame = self.toggle_call(k)
        ov = self.overrides
        if ov is not None and (ov.toggle in ("own", "original") or (ov.toggle == "none" and self.lightning)):
            return Frame(k, nested=False, user={}, own_block=True)
        assert frame is not None
        return frame

    def _forget(self, frame: Frame) -> None:
        """The block's exit called an override of ``untoggle_optimizer`` that never calls ``super()``:
        the block and the toggles left open inside it are let go, innermost first, without writing
        (a nested one's record put back); ``requires_grad`` is the override's business."""
        above = []
        if any(f is frame for f in self.stack):
            while True:
                top = self.stack.pop()
                if top is frame:
                    break
                above.append(top)
        for f in [*above, frame]:
            if not f.closed:
                f.closed = True
                if f.nested:
                    self.record = f.previous_record
                else:
                    self.flat_record = None

    # -- toggling --------------------------------------------------------------------------

    def toggle(self, k: int) -> Frame:
        """``toggle_optimizer(k)``, statement or block: the toggle happens at the call."""
        managed, live = self.managed, set(self.optimizers[k])
        if not self.stack:  # flat: exactly Lightning
            outer: tuple[dict[int, bool], set[int], list[bool]] | None = None
            if self.record and self.record is self.flat_record and not self.lightning:
                # a statement toggle is open (its very record): a block would nest in it
                known = len(self.record) == len(self.flat_own)
                its = {i for i, mine in zip(self.record, self.flat_own) if mine} if known else set()
                outer = (self.record, its, list(self.flat_own))
            record = lightning_toggle(self.rg, self.optimizers, k)
            frame = Frame(k, nested=False, user=dict(record), previous_record=self.record, managed=managed, live=live,
                          outer=outer)
            self.record = self.flat_record = record
            self.flat_own = [i in live for i in record]
            return frame
        # Nested: the user's view. A parameter the enclosing toggle left live shows its current value;
        # one it froze shows what it recorded (a parameter the optimizers took on since: its current value).
        enclosing = self.stack[-1]
        user = {i: (self.rg[i] if i in enclosing.live else enclosing.user.get(i, self.rg[i])) for i in managed}
        frame = Frame(
            k, nested=True, user=user, entry=list(self.rg), previous_record=self.record, managed=managed, live=live
        )
        for i in managed:
            self.rg[i] = False
        for i in self.optimizers[k]:
            self.rg[i] = user[i]
        self.record = dict(user)
        self.stack.append(frame)  # a nested toggle is open from the call on, entered or not
        self.nested_seen = True
        return frame

    def nest(self, frame: Frame) -> None:
        """A flat block toggled while a statement toggle was open starts (its ``__enter__``): it becomes
        a nested toggle from the user's view. A parameter the statement's optimizer holds shows its
        value found at the call, any other what the statement recorded; leaving restores the values
        found at the call and the statement's record."""
        if frame.outer is None or frame.nested:
            return
        outer, live, own = frame.outer
        found = frame.user  # flat: the values found at the call
        user = {i: (found[i] if i in live else outer.get(i, found[i])) for i in frame.managed}
        entry = list(self.rg)
        for i in frame.managed:
            entry[i] = found[i]
        frame.nested, frame.entry, frame.previous_record, frame.user = True, entry, outer, user
        for i in frame.live:  # only what differs from what the call left is written
            if user[i] != found[i]:
                self.rg[i] = user[i]
        self.flat_record, self.flat_own = outer, own  # the statement is the one open
        self.record = dict(user)
        self.stack.append(frame)
        self.nested_seen = True

    def enter(self, frame: Frame, sync_grad: bool = True) -> None:
        """The ``with`` statement starts (before ``zero_grad``)."""
        frame.entered = True
        frame.sync_grad = sync_grad

    def start_body(self, frame: Frame) -> None:
        """The block's entry is done (``zero_grad`` included): its body starts."""
        frame.in_body = True
        if frame.own_block:
            self.own_blocks.append(frame)
        elif frame.outer is not None:
            self.nest(frame)
        elif not frame.nested:
            self.stack.append(frame)

    def exit(self, frame: Frame) -> None:
        """The block ends, by any path: untoggle (the step, if any, came before).

        Statement toggles left open inside it are unwound first, innermost first. Where the module's
        class overrides ``untoggle_optimizer``, the exit is that override (its ``super()`` is the untoggle).
        """
        if frame.own_block:
            if frame in self.own_blocks:
                self.own_blocks.remove(frame)
            self.untoggle_call(frame.k)
            return
        if frame.closed:
            return
        if frame.entered:
            self.nest(frame)  # entered, nested inside a statement toggle before its entry could fail
        ov = self.overrides
        if ov is not None and ov.untoggle == "original" and not self.lightning:
            self._lightnings_untoggle(frame.k)  # the override, not toggleshim's untoggle: then let go
            self._forget(frame)
        elif ov is not None and ov.untoggle == "own":
            self._forget(frame)
        elif any(f is frame for f in self.stack):
            while True:
                top = self.stack.pop()
                self._undo(top)
                if top is frame:
                    break
        else:
            self._undo(frame)
        if ov is not None and ov.untoggle:
            self._write(ov.untoggle_sets)

    def untoggle(self, k: int) -> None:
        """``untoggle_optimizer(k)`` as a statement."""
        top = self.stack[-1] if self.stack else None
        if top is not None and not top.entered and top.k == k:
            self.stack.pop()
            self._undo(top)
            return
        lightning_untoggle(self.rg, self.record or {}, self.optimizers, k)
        self.record = {}
        self.flat_record = None

    def _undo(self, frame: Frame) -> None:
        if frame.closed:
            return
        frame.closed = True
        if frame.nested:
            # The parameters it toggled (those the optimizers held at the toggle; parameters in no
            # optimizer are never the toggle's business) get the values found on entry.
            for i in frame.managed:
                self.rg[i] = frame.entry[i]
            self.record = frame.previous_record
        else:  # Lightning's untoggle, on the optimizers and the record as they are now
            lightning_untoggle(self.rg, self.record or {}, self.optimizers, frame.k)
            self.record = {}
            self.flat_record = None

    def stepped(self, k: int) -> None:
        """Optimizer ``k`` stepped: every open block over it has seen a step in its body (at its clean
        exit the shim then refuses to step again: a double step)."""
        for frame in [*self.stack, *self.own_blocks]:
            if frame.k == k and frame.in_body and not frame.closed:
                frame.stepped = True

    def refuses_step(self, frame: Frame, step: bool, completed: bool) -> bool:
        """The shim's exit raises instead of stepping a second time, whatever made the toggle (never
        Lightning's own methods driven by hand)."""
        return not self.lightning and step and completed and frame.stepped

    # -- what the invariants talk about ----------------------------------------------------

    def sync_blocked(self) -> bool:
        """Gradient sync must be off while the body of a block with ``sync_grad=False`` runs (blocks
        nested in it included); it is back on once every such block has ended, by any path. It
        is not yet off between the toggle and the ``with`` statement (the toggle is a plain call)."""
        return any(f.in_body and not f.closed and not f.sync_grad for f in [*self.stack, *self.own_blocks])

    def trainable_inside(self) -> set[int] | None:
        """Inside the innermost open block: the managed parameters that may train (None outside)."""
        if not self.stack:
            return None
        top = self.stack[-1]
        return {i for i in self.optimizers[top.k] if self.rg[i]}
