"""The C kernels (``toggleshim/_speedups.c``) against their Python reference (``_py_enter_flat``,
``_py_leave_flat`` in ``toggleshim/_toggle.py``), differentially.

Hypothesis builds the same world twice (optimizers over parameters, as the kernels see them: objects
with ``param_groups``, groups with ``"params"``) and runs one kernel on each twin: the result, every
``requires_grad`` afterwards, every exception (type and message) and the log of every read the
kernels make of the optimizers and their lists must be the same. The worlds include what users do
to the lists between a toggle and its exit, records edited in the block, containers that are not
lists, and failures anywhere in the reading or in torch's ``requires_grad`` setter. The rest of
the suite runs whole programs through whichever kernels are in use (`.ci/run` runs it once each way).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from toggleshim import _toggle

try:
    from toggleshim import _speedups
except ImportError:  # pragma: no cover - shown as a failure, not a skip
    _speedups = None


def test_the_c_kernels_are_built_and_in_use_unless_switched_off() -> None:
    assert _speedups is not None, (
        "toggleshim._speedups is not built (a C compiler is needed at install: `pip install -e .` builds it); "
        "toggleshim works without it, with the Python kernels"
    )
    pure = os.environ.get("TOGGLESHIM_PURE_PYTHON", "") not in ("", "0")
    assert ("python" if pure else "C") == _toggle.KERNELS
    assert (_toggle._enter_flat is _toggle._py_enter_flat) is pure
    assert (_toggle._leave_flat is _toggle._py_leave_flat) is pure


class Boom(Exception):
    pass


class Halt(BaseException):  # not an Exception: the exit's check must let it through
    pass


FAIL_KINDS = (Boom, Halt)


@dataclass
class World:
    log: list[tuple[Any, ...]] = field(default_factory=list)
    params: list[torch.Tensor] = field(default_factory=list)


class Params:
    """A ``"params"`` container that is not a list: iterated (and length-hinted) by the reader."""

    def __init__(self, world: World, items: list[Any], fail_at: int | None, kind: type[BaseException]) -> None:
        self.world, self.items, self.fail_at, self.kind = world, items, fail_at, kind

    def __len__(self) -> int:
        self.world.log.append(("len",))
        return len(self.items)

    def __iter__(self) -> Any:
        self.world.log.append(("iter",))
        for i, p in enumerate(self.items):
            if i == self.fail_at:
                raise self.kind(f"params iteration fails at {i}")
            yield p


class ParamList(list):  # type: ignore[type-arg]
    """A list subclass whose iteration is logged."""

    def __init__(self, world: World, items: list[Any]) -> None:
        super().__init__(items)
        self.world = world

    def __iter__(self) -> Any:
        self.world.log.append(("iter list",))
        return super().__iter__()


class Group(dict):  # type: ignore[type-arg]
    """A dict subclass group whose ``__getitem__`` is logged (and may fail)."""

    world: World
    fail: BaseException | None

    def __getitem__(self, key: Any) -> Any:
        self.world.log.append(("getitem", key))
        if self.fail is not None:
            raise self.fail
        return super().__getitem__(key)


class Opt:
    """What the kernels read of an optimizer: ``param_groups`` (logged, may fail)."""

    def __init__(self, world: World, name: int, groups: Any, fail: BaseException | None) -> None:
        self.world, self.name, self.groups, self.fail = world, name, groups, fail

    @property
    def param_groups(self) -> Any:
        self.world.log.append(("param_groups", self.name))
        if self.fail is not None:
            raise self.fail
        return self.groups


# -- the world, drawn as plain data and built twice -----------------------------------------------

PARAM_KINDS = ("trainable", "frozen", "non-leaf", "integer")


def make_param(kind: str) -> torch.Tensor:
    if kind == "trainable":
        return nn.Parameter(torch.zeros(1))
    if kind == "frozen":
        return nn.Parameter(torch.zeros(1), requires_grad=False)
    if kind == "non-leaf":  # torch refuses any requires_grad assignment on it
        return torch.zeros(1, requires_grad=True) * 2
    return torch.zeros(1, dtype=torch.long)  # requires_grad=True on it raises


def failure(draw: Any, rare: bool = True) -> tuple[str, str] | None:
    if draw(st.integers(0, 15 if rare else 3)) != 0:
        return None
    return draw(st.sampled_from(["Boom", "Halt"])), draw(st.sampled_from(["a", "b"]))


def to_exc(spec: tuple[str, str] | None) -> BaseException | None:
    if spec is None:
        return None
    kind = Boom if spec[0] == "Boom" else Halt
    return kind(f"injected {spec[1]}")


@st.composite
def layouts(draw: Any, n_params: int) -> list[dict[str, Any]]:
    """Optimizers as data: groups of parameter indices, with container kinds and failures."""
    opts = []
    for _ in range(draw(st.integers(1, 4))):
        groups = []
        for _ in range(draw(st.integers(0, 3))):
            groups.append({
                "params": draw(st.lists(st.integers(0, n_params - 1), max_size=5)),
                "container": draw(st.sampled_from(["list", "list", "tuple", "listsub", "iterable"])),
                "group": draw(st.sampled_from(["dict", "dict", "logged"])),
                "getitem_fails": failure(draw),
                "iter_fails_at": draw(st.none() | st.integers(0, 4)) if draw(st.integers(0, 9)) == 0 else None,
                "iter_fail": draw(st.sampled_from(["Boom", "Halt"])),
            })
        opts.append({
            "groups": groups,
            "groups_container": draw(st.sampled_from(["list", "list", "tuple"])),
            "fails": failure(draw),
        })
    return opts


EDITS = ("none", "append", "drop", "swap", "replace-list", "to-tuple", "new-optimizer", "drop-optimizer",
         "add-optimizer", "add-group")


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    n_params = draw(st.integers(1, 8))
    kinds = draw(st.lists(st.sampled_from(PARAM_KINDS), min_size=n_params, max_size=n_params))
    # Most worlds are plain (the fast path's case); failures and odd parameters on purpose in the rest.
    plain = draw(st.booleans())
    if plain:
        kinds = [k if k in ("trainable", "frozen") else "trainable" for k in kinds]
    layout = draw(layouts(n_params))
    if plain:
        for o in layout:
            o["fails"] = None
            for g in o["groups"]:
                g["getitem_fails"] = None
                g["iter_fails_at"] = None
    toggled = draw(st.integers(0, len(layout)))  # == len(layout): an optimizer outside the list
    wrapped = draw(st.booleans())  # the toggled optimizer is a wrapper; the list may hold either
    edit = draw(st.sampled_from(EDITS)) if draw(st.booleans()) else "none"
    return {
        "kinds": kinds, "layout": layout, "toggled": toggled, "wrapped": wrapped,
        "list_holds_inner": draw(st.booleans()), "edit": edit, "edit_at": draw(st.integers(0, 20)),
        "record": draw(st.sampled_from(RECORD_EDITS)) if draw(st.booleans()) else "same",
        "vals_changed": draw(st.integers(0, 7)) == 0, "record_at": draw(st.integers(0, 20)),
        "requires_grad_before_leave": draw(st.lists(st.booleans(), min_size=n_params, max_size=n_params)),
        "restore_bits": draw(st.lists(st.booleans(), min_size=8, max_size=8)),
    }


RECORD_EDITS = ("same", "value-flipped", "value-int", "value-tensor", "key-replaced", "key-replaced-in-place",
                "key-removed", "key-added", "reordered", "subclass", "not-a-dict", "value-replaced-same")


def build(sc: dict[str, Any], markers: tuple[Any, Any]) -> dict[str, Any]:
    world = World()
    world.params = params = [make_param(k) for k in sc["kinds"]]

    def container(g: dict[str, Any]) -> Any:
        items = [params[i] for i in g["params"]]
        kind = g["container"]
        if kind == "tuple":
            return tuple(items)
        if kind == "listsub":  # iterated through its own __iter__ (as Lightning's `for` loops do)
            return ParamList(world, items)
        if kind == "iterable":
            return Params(world, items, g["iter_fails_at"], Boom if g["iter_fail"] == "Boom" else Halt)
        return items

    opts: list[Any] = []
    for k, o in enumerate(sc["layout"]):
        groups: list[Any] = []
        for g in o["groups"]:
            if g["group"] == "logged":
                group = Group(params=container(g))
                group.world, group.fail = world, to_exc(g["getitem_fails"])
            else:
                group = {"params": container(g)}
            groups.append(group)
        opts.append(Opt(world, k, tuple(groups) if o["groups_container"] == "tuple" else groups, to_exc(o["fails"])))
    outside = Opt(world, 99, [{"params": [params[0]]}], None)  # an optimizer the list does not hold
    inner = opts[sc["toggled"]] if sc["toggled"] < len(opts) else outside
    # a wrapper (as a LightningOptimizer) reads as its inner optimizer: the same groups
    optimizer = Opt(world, 100, inner.groups, inner.fail) if sc["wrapped"] else inner
    if sc["wrapped"] and not sc["list_holds_inner"] and sc["toggled"] < len(opts):
        opts[sc["toggled"]] = optimizer
    return {"world": world, "opts": opts, "optimizer": optimizer, "inner": inner, "markers": markers}


def plan_of(b: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]] | None:
    """seq, managed, free as the plan would hold them (read without logging or failures), or None."""
    toggled_marker, end = b["markers"]
    seq: list[Any] = []
    own: list[Any] = []
    for opt in b["opts"]:
        mine = opt is b["optimizer"] or opt is b["inner"]
        if mine:
            seq.append(toggled_marker)
        if opt.fail is not None:
            return None
        for group in opt.groups:
            if isinstance(group, Group) and group.fail is not None:
                return None
            params = dict.__getitem__(group, "params")
            items = params.items if isinstance(params, Params) else list(params)
            if isinstance(params, Params) and params.fail_at is not None and params.fail_at < len(items):
                return None
            seq += items
            if mine:
                own += items
        seq.append(end)
    managed = tuple({id(p): p for x in seq if isinstance(x, torch.Tensor) for p in [x]}.values())
    free = tuple(p for p in managed if not any(p is q for q in own))
    return tuple(seq), managed, free


def edit(b: dict[str, Any], sc: dict[str, Any]) -> None:
    """What the user does to the optimizers between the plan and the kernel (the same on both twins)."""
    opts, params, at, how = b["opts"], b["world"].params, sc["edit_at"], sc["edit"]
    lists = [dict.get(g, "params") for o in opts for g in (o.groups or []) if isinstance(dict.get(g, "params"), list)]
    if how == "none":
        return
    if how in ("append", "drop", "swap", "replace-list", "to-tuple") and lists:
        target = lists[at % len(lists)]
        if how == "append":
            target.append(params[at % len(params)])
        elif how == "drop" and target:
            target.pop(at % len(target))
        elif how == "swap" and target:
            target[at % len(target)] = params[(at + 1) % len(params)]
        else:
            for o in opts:
                for g in o.groups or []:
                    if dict.get(g, "params") is target:
                        dict.__setitem__(g, "params", list(target) if how == "replace-list" else tuple(target))
    elif how == "new-optimizer" and opts:
        k = at % len(opts)
        old = opts[k]
        opts[k] = Opt(b["world"], old.name, old.groups, old.fail)
    elif how == "drop-optimizer" and opts:
        del opts[at % len(opts)]
    elif how == "add-optimizer":
        opts.insert(at % (len(opts) + 1), Opt(b["world"], 50, [{"params": [params[at % len(params)]]}], None))
    elif how == "add-group" and opts and isinstance(opts[0].groups, list):
        opts[0].groups.append({"params": [params[at % len(params)]]})


def observe(b: dict[str, Any], call: Any) -> dict[str, Any]:
    world = b["world"]
    world.log.clear()
    out: dict[str, Any] = {}
    try:
        result = call()
    except (Exception, Halt) as exc:
        out["raised"] = (type(exc).__name__, str(exc))
    else:
        out["result"] = describe(b, result)
    out["requires_grad"] = [p.requires_grad for p in world.params]
    out["log"] = list(world.log)
    return out


def describe(b: dict[str, Any], value: Any) -> Any:
    """A value with every world object replaced by its position (so the twins compare)."""
    toggled_marker, end = b["markers"]
    index = {id(p): i for i, p in enumerate(b["world"].params)}
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [describe(b, v) for v in value])
    if value is toggled_marker:
        return "TOGGLED"
    if value is end:
        return "END"
    if isinstance(value, torch.Tensor):
        return ("param", index.get(id(value)))
    return value


PY_MARKERS = (_toggle._TOGGLED, _toggle._END)
C_MARKERS = (getattr(_speedups, "TOGGLED", None), getattr(_speedups, "END", None))


def twins(sc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The world of ``sc`` built for the Python kernels and for the C ones, planned, then edited."""
    pair = build(sc, PY_MARKERS), build(sc, C_MARKERS)
    for b in pair:
        b["plan"] = plan_of(b) or ((), (), ())  # a plan that cannot be read: one that fits nothing
        edit(b, sc)
    return pair


def _kernels() -> tuple[Any, Any]:
    assert _speedups is not None, "toggleshim._speedups is not built"
    return _speedups.enter_flat, _speedups.leave_flat


@settings(max_examples=settings.default.max_examples * 25)
@given(scenarios())
def test_enter_flat_in_c_is_the_python_reference(sc: dict[str, Any]) -> None:
    c_enter, _ = _kernels()
    py, c = twins(sc)

    def run(b: dict[str, Any], kernel: Any) -> dict[str, Any]:
        seq, managed, free = b["plan"]
        return observe(b, lambda: kernel(b["opts"], b["optimizer"], b["inner"], seq, managed, free))

    assert run(c, c_enter) == run(py, _toggle._py_enter_flat)


def record_for(b: dict[str, Any], sc: dict[str, Any], vals: tuple[bool, ...]) -> tuple[Any, dict[Any, bool]]:
    """The record handed out (``last_record``) and the one found at the exit (edited as ``sc`` says)."""
    managed = b["plan"][1]
    last = dict(zip(managed, vals))
    record: Any = last.copy()
    at, how = sc["record_at"], sc["record"]
    keys = list(record)
    params = b["world"].params
    if how == "value-flipped" and keys:
        record[keys[at % len(keys)]] = not record[keys[at % len(keys)]]
    elif how == "value-int" and keys:
        record[keys[at % len(keys)]] = int(record[keys[at % len(keys)]])
    elif how == "value-tensor" and keys:
        record[keys[at % len(keys)]] = torch.tensor(record[keys[at % len(keys)]])
    elif how == "value-replaced-same" and keys:
        record[keys[at % len(keys)]] = bool(int(record[keys[at % len(keys)]]))  # the same bool object
    elif how == "key-replaced" and keys:
        key = keys[at % len(keys)]
        value = record.pop(key)
        other = params[at % len(params)]
        record[other if other is not key else nn.Parameter(torch.zeros(1))] = value
    elif how == "key-replaced-in-place" and keys:  # the same values in the same order, one key another's
        k = at % len(keys)
        stranger = params[at % len(params)]
        if any(stranger is key for key in keys):
            stranger = nn.Parameter(torch.zeros(1))
        record = {stranger if i == k else key: value for i, (key, value) in enumerate(record.items())}
    elif how == "key-removed" and keys:
        del record[keys[at % len(keys)]]
    elif how == "key-added":
        record[nn.Parameter(torch.zeros(1))] = True
    elif how == "reordered" and len(keys) > 1:
        record = {k: record[k] for k in reversed(keys)}
    elif how == "subclass":
        record = type("Record", (dict,), {})(record)
    elif how == "not-a-dict":
        record = list(record.items())
    return record, last


@settings(max_examples=settings.default.max_examples * 25)
@given(scenarios())
def test_leave_flat_in_c_is_the_python_reference(sc: dict[str, Any]) -> None:
    _, c_leave = _kernels()
    py, c = twins(sc)

    def run(b: dict[str, Any], kernel: Any) -> dict[str, Any]:
        seq, managed, _free = b["plan"]
        world = b["world"]
        vals = tuple(p.requires_grad for p in managed)
        record, last = record_for(b, sc, vals)
        last_vals = tuple(not v for v in vals) if sc["vals_changed"] and vals else vals
        picked = [i for i, bit in zip(range(len(managed)), sc["restore_bits"]) if bit]
        restore = tuple(managed[i] for i in picked)
        restore_vals = tuple(vals[i] for i in picked)
        for p, want in zip(world.params, sc["requires_grad_before_leave"]):
            if p.is_leaf and p.is_floating_point():
                p.requires_grad = want
        return observe(b, lambda: kernel(
            b["opts"], b["optimizer"], b["inner"], record, vals, seq, last_vals, last, restore, restore_vals))

    assert run(c, c_leave) == run(py, _toggle._py_leave_flat)


def test_leave_flat_lets_a_base_exception_through_and_changes_nothing() -> None:
    _, c_leave = _kernels()
    for kernel, markers in ((c_leave, C_MARKERS), (_toggle._py_leave_flat, PY_MARKERS)):
        world = World()
        p = nn.Parameter(torch.zeros(1), requires_grad=False)
        world.params = [p]
        opt = Opt(world, 0, [{"params": [p]}], None)
        seq = (markers[0], p, markers[1])
        opt.fail = Halt("stop")
        with pytest.raises(Halt, match="stop"):
            kernel([opt], opt, opt, {p: True}, (True,), seq, (True,), {p: True}, (p,), (True,))
        assert p.requires_grad is False
        opt.fail = Boom("unreadable")  # an Exception: the long way (False), nothing changed
        assert kernel([opt], opt, opt, {p: True}, (True,), seq, (True,), {p: True}, (p,), (True,)) is False
        assert p.requires_grad is False


@pytest.mark.parametrize("bad", [
    ("enter_flat", 5), ("enter_flat", 7), ("leave_flat", 9),
])
def test_c_kernels_reject_wrong_arity(bad: tuple[str, int]) -> None:
    _kernels()
    name, n = bad
    with pytest.raises(TypeError, match=f"{name}\\(\\) takes"):
        getattr(_speedups, name)(*([()] * n))


def test_c_kernels_reject_non_tuples() -> None:
    _kernels()
    assert _speedups is not None
    with pytest.raises(TypeError, match="argument 4 must be a tuple"):
        _speedups.enter_flat([], None, None, [], (), ())
    with pytest.raises(TypeError, match="argument 9 must be a tuple"):
        _speedups.leave_flat([], None, None, {}, (), (), (), {}, [], ())


GC_DURING_READ = '''
import gc, importlib.util, sys
spec = importlib.util.spec_from_file_location("toggleshim._speedups", sys.argv[1])  # the built file alone
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)

class P:
    requires_grad = True

class Finalizer:  # cyclic garbage: its __del__ runs in the collector, and empties the list being read
    def __init__(self, target):
        self.target, self.me = target, self

    def __del__(self):
        self.target.clear()

class Group(dict):
    def __getitem__(self, key):
        params = dict.__getitem__(self, key)
        Finalizer(params)
        return params

class Opt:
    def __init__(self, groups):
        self.param_groups = groups

lengths = set()
for _ in range(100):
    params = [P() for _ in range(50)]
    opt = Opt([Group(params=params)])
    seq = (S.TOGGLED, *params[:3], object(), S.END)  # the plan's layout differs at the fourth item
    gc.collect()
    gc.set_threshold(1)  # the first allocation after the mismatch runs the collector
    try:
        layout = S.enter_flat([opt], opt, opt, seq, (), ())
    finally:
        gc.set_threshold(700, 10, 10)
    lengths.add(len(layout))
print(sorted(lengths))
'''


def test_c_layout_read_survives_a_finalizer_that_changes_the_list() -> None:
    """After a mismatch the C reader allocates, which may run the collector and finalizers that
    change the list being read: it must re-read the list (an earlier version kept a pointer into
    the list's items and crashed here). In a subprocess: a crash is a failure, not a dead worker."""
    _kernels()
    assert _speedups is not None
    proc = subprocess.run([sys.executable, "-X", "dev", "-c", GC_DURING_READ, _speedups.__file__],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the marker, three matching items, the item in hand at the mismatch, the end marker
    assert proc.stdout.strip() == "[6]"
