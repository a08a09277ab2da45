"""The runner: a program run on a world by a driver, the reference model checked at every point.

Every point of the run is recorded as a :class:`Snapshot`, so that two runs can be compared bitwise
afterwards (:mod:`toggleshim.testing._checks`); :func:`run_in_trainer` runs a program inside a real
``Trainer.fit``. Re-exported by :mod:`toggleshim.testing.harness`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from toggleshim._flavours import NAMES
from toggleshim.testing import model as _model
from toggleshim.testing._drivers import ManualDriver, _effective, _inner
from toggleshim.testing._worlds import (
    InjectedFault,
    Mismatch,
    World,
    _build_optimizers,
    _built,
    _flavour_module,
    _graph_terms,
    _names,
    _optimizer_params,
    build_graph,
)
from toggleshim.testing.report import bounded, compact_record
from toggleshim.testing.specs import (
    SYNC_FAULTS,
    Backward,
    BadFlag,
    Block,
    EditRecord,
    Raise,
    ReplaceRecord,
    SetRequiresGrad,
    Statement,
    Untoggle,
    WorldSpec,
)


class _RecordLookalike(dict):  # type: ignore[type-arg]
    """A dict subclass that says it is a ``dict`` (``__class__``): only ``type()`` tells. Its lookups
    (``in``, ``[]``) are logged in ``reads``: Lightning's untoggle reads a record through them, and an
    exit that reads such a record another way (trusting its items) shows in the log."""

    reads: list[Any]

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return dict

    def __contains__(self, key: object) -> bool:
        self.reads.append(key)
        return dict.__contains__(self, key)

    def __getitem__(self, key: Any) -> Any:
        self.reads.append(key)
        return dict.__getitem__(self, key)


# -- running, with the model checked at every point -------------------------------------------


@dataclass
class Snapshot:
    """What a world looks like at one point of the program."""

    where: str
    requires_grad: tuple[bool, ...]
    grads: tuple[torch.Tensor | None, ...]
    record: tuple[tuple[int, bool], ...] | None
    full: dict[str, Any] | None = None
    sync_blocked: bool | None = None  # the stand-in strategy's gradient sync is blocked (None: no stand-in)
    record_reads: tuple[int, ...] = ()  # the lookups of a replaced record so far, by parameter


@dataclass
class Run:
    """A program's run on one world: snapshots, the exceptions that came out, and the optimizer calls."""

    snapshots: list[Snapshot]
    outcomes: list[tuple[str, str, bool] | None]
    calls: list[tuple[str, int]]
    expected_calls: list[tuple[str, int]]
    sync_log: list[str] = field(default_factory=list)
    expected_sync: list[str] = field(default_factory=list)
    hooks: list[tuple[str, int]] = field(default_factory=list)
    expected_hooks: list[tuple[str, int]] = field(default_factory=list)
    nested: bool = False  # a toggle took the shim's nesting rule: no manual sequence to compare with
    override_log: list[str] = field(default_factory=list)  # the calls of the user's own methods


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone()


def _placed(record: Any, cls: Any, where: str) -> Any:
    """``cls(record)``, made at a lower (``"below"``) or higher (``"above"``) address than ``record``
    where one of a few tries gets there: toggleshim knows a record by identity only, so no order of
    addresses may count (an ``id`` compared with ``>=`` would take a replacement made above the old
    record for it, one compared with ``<=`` one made below)."""
    tries = [cls(record) for _ in range(16)]
    return (min if where == "below" else max)(tries, key=id)


class _Runner:
    def __init__(self, world: World, driver: Any, check_model: bool) -> None:
        self.world = world
        self.driver = driver
        self.model = _model.ToggleModel(world.optimizers_spec, [p.requires_grad for p in world.params],
                                        lightning=isinstance(driver, ManualDriver), overrides=world.overrides)
        if world.overrides is not None:  # the overrides' super(): Lightning's own in the manual world
            world.module._lightning_super = isinstance(driver, ManualDriver)
        self.check_model = check_model
        self.snapshots: list[Snapshot] = []
        self.expected: list[tuple[str, int]] = []
        self.expected_sync: list[str] = []
        self.path: list[str] = []

    def expected_global_step(self) -> int:
        """In stand-in worlds, the model's count: one per step that reached a ``LightningOptimizer``."""
        w = self.world
        if w.strategy is None:
            return int(w.global_step())  # under a real Trainer: compared between the runs instead
        return sum(len(_model.expected_hooks(k, k in w.wrapped, name == "step")) // 2 for name, k in w.reached)

    # -- points --
    def point(self, label: str, full: bool = False) -> None:
        w = self.world
        where = "/".join([*self.path, label])
        rg = tuple(p.requires_grad for p in w.params)
        index = {id(p): i for i, p in enumerate(w.params)}
        raw = w.module.__dict__.get("_param_requires_grad_state")
        record = None if raw is None else tuple((index.get(id(p), -1), v) for p, v in raw.items())
        strategy = w.strategy
        snap = Snapshot(where, rg, tuple(_clone(p.grad) for p in w.params), record,
                        sync_blocked=None if strategy is None else strategy.blocked > 0,
                        record_reads=tuple(index.get(id(p), -1) for p in w.record_reads))
        if full:
            snap.full = {
                "params": [_clone(p) for p in w.params],
                "buffers": [_clone(b) for b in w.module.buffers()],
                "state": [copy.deepcopy(_inner(o).state_dict()) for o in w.opts],
                "global_step": w.global_step(),
            }
        self.snapshots.append(snap)
        if self.check_model:
            self._check_model(snap)

    def _check_model(self, snap: Snapshot) -> None:
        m = self.model
        if list(snap.requires_grad) != m.rg:
            names = _names(self.world)
            diff = [
                f"parameter `{names[i]}` is {'trainable' if got else 'frozen'}, the model says "
                f"{'trainable' if want else 'frozen'}"
                for i, (got, want) in enumerate(zip(snap.requires_grad, m.rg))
                if got != want
            ]
            raise Mismatch(f"{self.driver.name} world at {snap.where}: " + bounded(diff, "parameters"), diff)
        if snap.sync_blocked is not None and snap.sync_blocked != m.sync_blocked():
            raise Mismatch(
                f"{self.driver.name} world at {snap.where}: gradient sync is "
                f"{'blocked' if snap.sync_blocked else 'on'}, the model says "
                f"{'blocked (inside a block with sync_grad=False)' if m.sync_blocked() else 'on'}"
            )
        if snap.full is not None and snap.full["global_step"] != self.expected_global_step():
            raise Mismatch(
                f"{self.driver.name} world at {snap.where}: global_step is {snap.full['global_step']}, the "
                f"model says {self.expected_global_step()} (one per step through a LightningOptimizer)"
            )
        want_record = None if m.record is None else tuple(m.record.items())
        if snap.record != want_record:
            raise Mismatch(
                f"{self.driver.name} world at {snap.where}: _param_requires_grad_state is "
                f"{compact_record(snap.record, want_record)}, the model says {compact_record(want_record, snap.record)}"
            )

    # -- ops --
    def run(self, program: Sequence[object]) -> Run:
        outcomes: list[tuple[str, str, bool] | None] = []
        self.point("start", full=True)
        for n, op in enumerate(program):
            self.path = [f"op{n}"]
            before = len(self.world.raised)
            try:
                self.op(op)
                outcomes.append(None)
            except Mismatch:  # the harness's verdict, never one of the program's outcomes
                raise
            except BaseException as exc:  # the program's faults come out here, KeyboardInterrupt too
                ours = self.world.raised[before:]
                injected = any(exc is e for e in ours)
                if ours and exc is not ours[0]:  # the first error propagates (docs/guarantees.md)
                    raise Mismatch(
                        f"{self.driver.name} world at op{n}: {exc!r} came out instead of the very "
                        f"exception the program raised first ({ours[0]!r})"
                    ) from exc
                if not ours and self.check_model:  # the model has no error the program did not raise
                    raise Mismatch(
                        f"{self.driver.name} world at op{n}: {exc!r} came out, which the program did not "
                        f"raise (the model says nothing fails here)"
                    ) from exc
                outcomes.append((type(exc).__name__, str(exc), injected))
            self.path = [f"op{n}"]
            self.point("end", full=True)
        strategy = self.world.strategy
        wrapped = self.world.wrapped
        expected_hooks = [
            hook for name, k in self.world.reached for hook in _model.expected_hooks(k, k in wrapped, name == "step")
        ]
        return Run(
            self.snapshots,
            outcomes,
            list(self.world.calls),
            self.expected,
            [] if strategy is None else list(strategy.sync_log),
            self.expected_sync,
            [] if strategy is None else list(strategy.hooks),
            expected_hooks if strategy is not None else [],
            nested=self.model.nested_seen,
            override_log=list(getattr(self.world.module, "override_log", [])),
        )

    def op(self, op: object) -> None:
        w, m = self.world, self.model
        if isinstance(op, SetRequiresGrad):
            w.params[op.param].requires_grad_(op.value)
            m.set_requires_grad(op.param, op.value)
            self.point("set")
        elif isinstance(op, EditRecord):
            self.edit_record(op)
        elif isinstance(op, Backward):
            loss = sum((w.terms[t]() for t in op.terms), torch.zeros(()))
            try:
                if hasattr(w.module, "_trainer") and not isinstance(w.module._trainer, SimpleNamespace):
                    w.module.manual_backward(loss)
                else:
                    torch.autograd.backward(loss)
            except BaseException as error:  # nothing to differentiate: raised by the program as well
                w.raised.append(error)
                raise
            self.point("backward")
        elif isinstance(op, Raise):
            exc: BaseException = (
                KeyboardInterrupt("injected") if op.kind == "interrupt" else InjectedFault("body failed")
            )
            w.raised.append(exc)
            raise exc
        elif isinstance(op, Block):
            self.block(op)
        elif isinstance(op, Statement):
            self.statement(op)
        elif isinstance(op, Untoggle):
            self.driver.untoggle(w, op.k)
            m.untoggle_call(op.k)
            self.point(f"untoggled{op.k}")
        elif isinstance(op, BadFlag):
            self.driver.bad_flag(w, op)
            self.point("bad flag")
        elif isinstance(op, ReplaceRecord):
            record = w.module.__dict__.get("_param_requires_grad_state")
            if record is not None:
                replaced = _placed(record, dict if op.how == "dict" else _RecordLookalike, op.where)
                if isinstance(replaced, _RecordLookalike):
                    replaced.reads = w.record_reads
                w.module._param_requires_grad_state = replaced
                self.model.replace_record()
            self.point("record replaced")
        else:  # pragma: no cover - specs are closed
            raise TypeError(op)

    def edit_record(self, op: EditRecord) -> None:
        w, m = self.world, self.model
        record = w.module.__dict__.get("_param_requires_grad_state")
        if record:
            index = {id(p): i for i, p in enumerate(w.params)}
            param = list(record)[op.entry % len(record)]
            absent = [p for p in w.params if not any(p is q for q in record)]
            if op.how == "flip":
                record[param] = not record[param]
                m.edit_record(index[id(param)], record[param])
            elif op.how == "add":
                if absent:
                    record[absent[0]] = False
                    m.edit_record(index[id(absent[0])], False)
            else:
                del record[param]
                m.edit_record(index[id(param)], None)
                absent = [p for p in w.params if p is not param and not any(p is q for q in record)]
                if op.how == "replace" and absent:
                    record[absent[0]] = False
                    m.edit_record(index[id(absent[0])], False)
        self.point("record")

    def body(self, ops: Sequence[object], label: str) -> None:
        saved = self.path
        for n, op in enumerate(ops):
            self.path = [*saved, f"{label}{n}"]
            self.op(op)
        self.path = saved

    def block(self, written: Block) -> None:
        w, m = self.world, self.model
        op = _effective(written, w.overrides)  # the flags the block runs with (the user's methods decide)
        frame: _model.Frame | None = None
        completed = False
        # An enclosing block's fault still to fire (at its step, or its no-sync context's exit) waits
        # while this block runs, and is armed again after it: one fault slot, one block at a time
        waiting = (w.fault, w.strategy.fault if w.strategy is not None else None)
        w.fault = None
        if w.strategy is not None:
            w.strategy.fault = None
        # a fault of the no-sync context fires only where there is one (not under a real Trainer on CPU)
        sync_fault = op.fail if op.fail in SYNC_FAULTS and not op.sync_grad and w.strategy is not None else None

        def after_toggle() -> None:
            nonlocal frame
            frame = m.block_toggle(op.k)
            m.enter(frame, op.sync_grad)
            self.expected.extend(_model.expected_calls(op.k, op.zero_grad, op.step, None, sync_fault))
            if w.strategy is not None:
                self.expected_sync.extend(_model.expected_sync(op.sync_grad, True, sync_fault))
            self.point(f"toggled{op.k}")
            if sync_fault is not None:
                w.strategy.fault = sync_fault  # type: ignore[union-attr]
            elif op.fail not in (None, *SYNC_FAULTS):
                w.fault = (op.fail, op.k)

        body_done = -1  # where the exceptions raised once the body completed begin in w.raised

        def run_body() -> None:
            nonlocal completed, body_done
            if frame is not None:
                m.start_body(frame)
            self.point("entered")
            self.body(op.body, "b")
            completed, body_done = True, len(w.raised)

        refused = False
        try:
            self.driver.block(w, written, after_toggle, run_body)
            if frame is not None and m.refuses_step(frame, op.step, completed):
                raise Mismatch(f"{self.driver.name} world: the block over optimizer {op.k} stepped again after a "
                               "step inside it (the model says: a double step, refused)")
        except Mismatch:
            raise
        except BaseException as exc:
            refused = frame is not None and m.refuses_step(frame, op.step, completed)
            # toggleshim's refusal is this block's outcome (it comes first: the body completed), unless
            # an interrupt landed in the exit (it propagates ahead of errors)
            if refused and isinstance(exc, Exception) and self.check_model:
                if not (isinstance(exc, RuntimeError) and "would step twice" in str(exc)):  # either refusal
                    raise Mismatch(f"{self.driver.name} world: {exc!r} came out where the model expects the "
                                   "double step's RuntimeError") from exc
                # raised ahead of whatever the untoggle then raised (a no-sync context's exit fault)
                w.raised.insert(body_done, exc)
            raise
        finally:
            w.fault = waiting[0]
            if w.strategy is not None:
                w.strategy.fault = waiting[1]
            if frame is not None:
                m.exit(frame)
                self.expected.extend(_model.expected_calls(op.k, op.zero_grad, op.step and not refused, completed))
                if w.strategy is not None:
                    self.expected_sync.extend(_model.expected_sync(op.sync_grad, False, sync_fault))
                if op.step and completed and not refused and op.fail != "step":  # torch's step ran
                    m.stepped(op.k)
            self.point(f"left{op.k}", full=True)

    def statement(self, op: Statement) -> None:
        self.driver.toggle(self.world, op.k)
        self.model.toggle_call(op.k)
        self.point(f"toggled{op.k}")
        self.body(op.body, "s")
        self.driver.untoggle(self.world, op.k, op.other)
        self.model.untoggle_call(op.k)
        self.point(f"untoggled{op.k}")


def run_program(world: World, program: Sequence[object], driver: Any, check_model: bool = True) -> Run:
    """Run ``program`` on ``world`` with ``driver``; with ``check_model``, the model is checked at every point."""
    return _Runner(world, driver, check_model).run(program)


# -- under a real Trainer ---------------------------------------------------------------------


def run_in_trainer(
    spec: WorldSpec,
    driver: Any,
    flavour: str = NAMES[0],
    check_model: bool = True,
    batches: int = 1,
    **trainer_kwargs: Any,
) -> tuple[Run, World]:
    """Run ``spec.program`` inside ``Trainer.fit`` (manual optimization, CPU): the program runs in
    every ``training_step`` (``batches`` of them) through the ``LightningOptimizer`` s that
    ``self.optimizers()`` returns, so steps go through Lightning's strategy and precision plugin and
    ``global_step`` counts them. The runs of all batches are returned as one."""
    _built()
    pl = _flavour_module(flavour)
    module, inputs = build_graph(spec.graph, flavour, spec.overrides)
    params = list(module.parameters())
    for i in spec.frozen:
        params[i].requires_grad_(False)
    optimizers = _build_optimizers(spec.optimizers, params)
    result: dict[str, Any] = {}

    def training_step(self: Any, batch: Any, batch_idx: int) -> None:
        opts = self.optimizers()
        opts = list(opts) if isinstance(opts, (list, tuple)) else [opts]
        world = World(
            self,
            params,
            opts,
            _graph_terms(self, inputs),
            _optimizer_params(optimizers, params),
            global_step=lambda: int(self.trainer.global_step),
            overrides=spec.overrides,  # the module's class overrides toggle/untoggle_optimizer
        )
        world.instrument()
        try:
            run = run_program(world, spec.program, driver, check_model)
            if "run" in result:
                prev = result["run"]
                run = Run(
                    prev.snapshots + run.snapshots,
                    prev.outcomes + run.outcomes,
                    prev.calls + run.calls,
                    prev.expected_calls + run.expected_calls,
                )
            result["run"] = run
        finally:
            for opt in opts:  # the wrappers go: Lightning keeps these objects after fit
                opt.__dict__.pop("zero_grad", None)
                opt.__dict__.pop("step", None)
        result["world"] = world

    def train_dataloader(self: Any) -> Any:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(batches, 1)), batch_size=1)

    module.__class__ = type(
        "TrainerGraphModule",
        (type(module),),
        {
            "training_step": training_step,
            "train_dataloader": train_dataloader,
            "configure_optimizers": lambda self: optimizers,
        },
    )
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_steps=-1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer = pl.Trainer(**{**options, **trainer_kwargs})
    trainer.fit(module)
    if "run" not in result:
        raise Mismatch("the program did not run inside Trainer.fit")
    return result["run"], result["world"]
