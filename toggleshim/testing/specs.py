"""Specs (plain frozen dataclasses) and the Hypothesis strategies that draw them.

Everything a world is built from is drawn here: no value ever comes from torch's global RNG, so a
failing example is fully described by its specs (and printed as a runnable snippet).
Draw order: graph -> optimizer partition -> program (``@st.composite`` for the dependent draws).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from hypothesis import strategies as st

from toggleshim.testing.model import FLAG_DEFAULTS

__all__ = [
    "ENTRY_POINTS",
    "FLAT_EXAMPLES",
    "NESTED_EXAMPLES",
    "USER_CLASS_EXAMPLES",
    "WAYS_IN",
    "Backward",
    "BadFlag",
    "Block",
    "EditRecord",
    "GraphSpec",
    "LayerSpec",
    "OptimizerSpec",
    "Overrides",
    "Raise",
    "ReplaceRecord",
    "SetRequiresGrad",
    "Statement",
    "Untoggle",
    "WorldSpec",
    "graphs",
    "optimizer_partitions",
    "overrides",
    "programs",
    "worlds",
]

# -- specs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerSpec:
    """One leaf layer: ``kind`` in linear, conv1d, embedding, layernorm, batchnorm; ``dims`` its sizes."""

    kind: str
    dims: tuple[int, ...]
    bias: bool = True


@dataclass(frozen=True)
class GraphSpec:
    """Layers, tied weights (``(dst, src)``: layer ``dst`` uses layer ``src``'s weight) and loose parameters."""

    layers: tuple[LayerSpec, ...]
    ties: tuple[tuple[int, int], ...] = ()
    loose: tuple[int, ...] = ()  # sizes of free-standing parameters
    seed: int = 0


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer: ``kind``, and its param groups as (parameter numbers, hyper-parameters)."""

    kind: str
    groups: tuple[tuple[tuple[int, ...], tuple[tuple[str, float], ...]], ...]


@dataclass(frozen=True)
class Backward:
    """Backward of a loss over some terms (layers, then loose parameters): the rest gets no gradient."""

    terms: tuple[int, ...]


@dataclass(frozen=True)
class SetRequiresGrad:
    """The user sets ``requires_grad`` of parameter number ``param``."""

    param: int
    value: bool


@dataclass(frozen=True)
class EditRecord:
    """The user edits the record ``_param_requires_grad_state`` in place (nothing when it is empty).

    ``how``: ``"flip"`` the value of its ``entry``-th key (modulo its length), ``"delete"`` that key, or
    ``"replace"`` it: deleted, and the first parameter absent from the record added as ``False`` (the
    same length, other keys), or ``"add"`` that parameter as ``False`` (one key more, the others kept).
    Lightning's untoggle restores what the record holds at the untoggle.
    """

    entry: int
    how: str


@dataclass(frozen=True)
class Untoggle:
    """A stray ``untoggle_optimizer(opt[k])`` statement (no toggle of its own to pair with): inside a
    block it is Lightning's untoggle over the record, never the block's exit."""

    k: int


@dataclass(frozen=True)
class BadFlag:
    """``toggle_optimizer(opt[k], **{flag: value})`` with a value that is not a bool (``1``, ``None``,
    ``"yes"``...): a TypeError naming ``flag``, and nothing changed."""

    k: int
    flag: str
    value: object


@dataclass(frozen=True)
class ReplaceRecord:
    """The body replaces ``_param_requires_grad_state`` by another object holding the same entries:
    ``how`` is ``"dict"`` (a new dict) or ``"subclass"`` (a dict subclass that reports ``dict`` as its
    ``__class__``). Lightning's untoggle reads whatever object is there. ``where``: the new object
    is made ``"below"`` or ``"above"`` the old one in memory (where one of a few tries gets there):
    toggleshim knows a record by identity only, so no order of addresses may count."""

    how: str
    where: str = "below"


@dataclass(frozen=True)
class Raise:
    """The body raises: ``kind`` is ``"error"`` (an Exception) or ``"interrupt"`` (KeyboardInterrupt)."""

    kind: str = "error"


#: The ways users open a block: ``module.toggle_optimizer(opt, ...)``, ``toggleshim.toggle(module,
#: opt, ...)`` and ``toggleshim.Toggle(module, opt, ...)``.
ENTRY_POINTS = ("method", "toggle", "Toggle")

#: The ways into a block once made: the ``with`` statement, ``contextlib.ExitStack.enter_context``
#: (which looks ``__exit__`` up on the class, and calls it later), or by hand (``t.__enter__()``, then
#: ``t.__exit__(...)`` with the body's exception, if any).
WAYS_IN = ("with", "ExitStack", "by hand")


#: Faults of the strategy's no-sync context (a block with ``sync_grad=False``, in a world whose
#: strategy has ``block_backward_sync``): the call fails, its ``__enter__`` fails, or its ``__exit__``
#: fails after restoring sync.
SYNC_FAULTS = ("sync_call", "sync_enter", "sync_exit")


@dataclass(frozen=True, init=False, repr=False)
class Block:
    """``with toggle_optimizer(opt[k], **flags): body``; ``fail`` injects a fault in ``"zero_grad"``,
    ``"step"`` (before the update), ``"step_after"`` (after the update) or, with ``sync_grad=False``,
    one of :data:`SYNC_FAULTS`. ``sync_grad=False``: the body runs inside the strategy's
    ``block_backward_sync()``.

    The flags are the model's (``model.FLAG_DEFAULTS``), given by name (``Block(0, step=False)``)
    and read as attributes (``op.step``); ``flags`` holds every one of them, in that order.

    ``entry``: which of :data:`ENTRY_POINTS` opens the block, ``way`` which of :data:`WAYS_IN` enters
    it. ``explicit``: every flag is passed; otherwise only the flags that differ from their defaults
    (so that the defaults of every entry point are under test)."""

    k: int
    body: tuple[object, ...]
    fail: str | None
    entry: str
    explicit: bool
    flags: tuple[tuple[str, bool], ...]
    way: str

    def __init__(
        self,
        k: int,
        body: tuple[object, ...] = (),
        fail: str | None = None,
        entry: str = "method",
        explicit: bool = False,
        flags: tuple[tuple[str, bool], ...] | None = None,
        way: str = "with",
        **named: bool,
    ) -> None:
        given = dict(flags or (), **named)
        unknown = set(given) - set(FLAG_DEFAULTS)
        if unknown:
            raise TypeError(f"Block(): no flag {sorted(unknown)}; the block's flags: {list(FLAG_DEFAULTS)}")
        for name, value in (("k", k), ("body", body), ("fail", fail), ("entry", entry), ("explicit", explicit),
                            ("way", way)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "flags", tuple((n, given.get(n, d)) for n, d in FLAG_DEFAULTS.items()))

    def __getattr__(self, name: str) -> bool:  # a flag: op.zero_grad, op.step, op.sync_grad
        for flag, value in self.__dict__.get("flags", ()):
            if flag == name:
                return value  # type: ignore[no-any-return]
        raise AttributeError(name)

    def changed(self) -> dict[str, bool]:
        """The flags that differ from their defaults."""
        return {n: v for n, v in self.flags if v is not FLAG_DEFAULTS[n]}

    def passed(self) -> dict[str, bool]:
        """The flags the call passes, as users write it: every one where ``explicit``, else those that
        differ from their defaults."""
        return dict(self.flags) if self.explicit else self.changed()

    def __repr__(self) -> str:
        parts = [repr(self.k)]
        if self.body:
            parts.append(repr(self.body))
        parts += [f"{n}={v!r}" for n, v in self.changed().items()]
        for name, default in (("fail", None), ("entry", "method"), ("explicit", False), ("way", "with")):
            if getattr(self, name) != default:
                parts.append(f"{name}={getattr(self, name)!r}")
        return f"Block({', '.join(parts)})"


@dataclass(frozen=True)
class Statement:
    """Old-style ``toggle_optimizer(opt[k]); body; untoggle_optimizer(opt[k])`` (no ``finally``).
    ``other``: the untoggle is passed the other object for the same optimizer (the torch optimizer
    inside a ``LightningOptimizer``; for a torch optimizer, the same one)."""

    k: int
    body: tuple[object, ...] = ()
    other: bool = False


@dataclass(frozen=True)
class Overrides:
    """The module's own ``toggle_optimizer`` / ``untoggle_optimizer``, as users write them.

    ``toggle``: ``"super"`` (calls ``super().toggle_optimizer`` and returns its result), ``"none"``
    (calls it, returns None), ``"own"`` (never calls it: toggles by itself), ``"original"`` (calls
    Lightning's own method directly: a decorator applied before ``import toggleshim`` wraps it);
    ``untoggle``: ``"super"``, ``"own"`` or ``"original"``; None: not overridden. ``toggle_sets`` /
    ``untoggle_sets``: ``(parameter, value)`` written after that call (or in its place), parameters in
    or outside the optimizers. ``super_flags``: the flags the toggle passes to ``super()`` of its own
    (``zero_grad=False, step=last``: accumulation in an override), over those it was given.
    ``on_instance``: the methods are set on the instance (``mock.patch.object``, per-object patches),
    not the class. ``wraps``: each is a ``functools.wraps`` wrapper carrying the name, module and
    attributes of Lightning's own method (``"original"``: made before ``import toggleshim``) or of
    toggleshim's (``"ours"``: made after). Every call is recorded on the module (``override_log``)."""

    toggle: str | None = None
    untoggle: str | None = None
    toggle_sets: tuple[tuple[int, bool], ...] = ()
    untoggle_sets: tuple[tuple[int, bool], ...] = ()
    super_flags: tuple[tuple[str, bool], ...] = ()
    on_instance: bool = False
    wraps: str | None = None


@dataclass(frozen=True)
class WorldSpec:
    """A whole world: graph, which parameters the user froze, the optimizers, and the program.

    ``wrapped``: the optimizers the program passes as the ``LightningOptimizer`` of the flavour under
    test (wrapping the torch optimizer, with a stand-in strategy and loop hooks, as
    ``self.optimizers()`` returns them); the others are passed as torch optimizers. ``container``:
    the type of every param group's ``"params"`` (users and libraries put tuples there).
    """

    graph: GraphSpec
    frozen: tuple[int, ...]
    optimizers: tuple[OptimizerSpec, ...]
    program: tuple[object, ...]
    wrapped: tuple[int, ...] = ()
    container: str = "list"  # the param groups' "params": "list", "tuple" or "list subclass"
    overrides: Overrides | None = None  # the module's class overrides toggle/untoggle_optimizer

    @property
    def nested(self) -> bool:
        """True when a block or statement toggle sits inside a block, or a block inside a statement
        toggle (the shim's own nesting rule)."""
        return any(_nested_in_block(op, False) for op in self.program)


def _nested_in_block(op: object, in_block: bool, in_statement: bool = False) -> bool:
    """A block or statement toggle inside a block, or a block inside a statement toggle (a statement
    toggle inside a statement toggle is Lightning's flat one)."""
    if isinstance(op, (Block, Statement)):
        if in_block or (in_statement and isinstance(op, Block)):
            return True
        return any(
            _nested_in_block(o, in_block or isinstance(op, Block), in_statement or isinstance(op, Statement))
            for o in op.body
        )
    return False


# -- graph strategies -------------------------------------------------------------------------

_small = st.integers(1, 4)  # layer widths: tiny keeps a world ~10 ms, shapes still differ


@functools.cache
def _layers() -> st.SearchStrategy[LayerSpec]:
    return st.one_of(
        st.builds(LayerSpec, st.just("linear"), st.tuples(_small, _small), st.booleans()),
        st.builds(LayerSpec, st.just("conv1d"), st.tuples(_small, _small, st.integers(1, 3)), st.booleans()),
        st.builds(LayerSpec, st.just("embedding"), st.tuples(st.integers(2, 5), _small)),
        st.builds(LayerSpec, st.just("layernorm"), st.tuples(_small), st.booleans()),
        st.builds(LayerSpec, st.just("batchnorm"), st.tuples(_small)),
    )


@st.composite
def graphs(draw: st.DrawFn, max_layers: int = 5) -> GraphSpec:
    """Random module graphs: 1..max_layers leaf layers (5 is enough for every kind), maybe tied, maybe loose."""
    layers = draw(st.lists(_layers(), min_size=1, max_size=max_layers))
    same = [
        (d, s)
        for d in range(len(layers))
        for s in range(d)
        if layers[d].kind == layers[s].kind and layers[d].dims == layers[s].dims
    ]
    ties: list[tuple[int, int]] = []
    if same:
        for d, s in draw(st.lists(st.sampled_from(same), max_size=2, unique_by=lambda t: t[0])):
            if all(s != d2 for d2, _ in ties):  # tie to a layer that owns its weight
                ties.append((d, s))
    loose = draw(st.lists(_small, max_size=2))  # free-standing parameters, often in no optimizer
    return GraphSpec(tuple(layers), tuple(ties), tuple(loose), draw(st.integers(0, 2**16)))


_HYPER = {
    "sgd": st.fixed_dictionaries(
        {
            "lr": st.sampled_from([0.1, 0.05]),
            "momentum": st.sampled_from([0.0, 0.9]),
            "weight_decay": st.sampled_from([0.0, 0.01]),
        }
    ),
    "adam": st.fixed_dictionaries(
        {
            "lr": st.sampled_from([0.01, 0.001]),
            "weight_decay": st.sampled_from([0.0, 0.01]),
            "amsgrad": st.booleans(),
        }
    ),
    "adamw": st.fixed_dictionaries({"lr": st.sampled_from([0.01, 0.001]), "weight_decay": st.just(0.01)}),
    "rmsprop": st.fixed_dictionaries(
        {
            "lr": st.sampled_from([0.01, 0.001]),
            "momentum": st.sampled_from([0.0, 0.5]),
            "centered": st.booleans(),
        }
    ),
    "adagrad": st.fixed_dictionaries({"lr": st.sampled_from([0.1, 0.01])}),
}
OPTIMIZER_KINDS = tuple(_HYPER)


@st.composite
def optimizer_partitions(draw: st.DrawFn, n_params: int, max_optimizers: int = 4) -> tuple[OptimizerSpec, ...]:
    """Optimizers over parameter numbers: 1..max_optimizers (4: the issue's bound), with overlap
    (a parameter in two optimizers), parameters in none, and 1-2 param groups each."""
    n_opt = draw(st.integers(1, min(max_optimizers, n_params)))
    owner = draw(st.lists(st.integers(-1, n_opt - 1), min_size=n_params, max_size=n_params))
    members: list[list[int]] = [[] for _ in range(n_opt)]
    for i, k in enumerate(owner):
        if k >= 0:
            members[k].append(i)
    for k in range(n_opt):
        if not members[k]:
            members[k].append(draw(st.integers(0, n_params - 1)))
    if n_opt > 1 and draw(st.booleans()):  # share a parameter between two optimizers
        a, b = draw(st.permutations(range(n_opt)))[:2]
        shared = draw(st.sampled_from(members[a]))
        if shared not in members[b]:
            members[b].append(shared)
    specs = []
    for params in members:
        kind = draw(st.sampled_from(OPTIMIZER_KINDS))
        cut = draw(st.integers(0, len(params) - 1)) if len(params) > 1 else 0
        parts = [params[:cut], params[cut:]] if cut else [params]
        groups = tuple((tuple(p), tuple(sorted(draw(_HYPER[kind]).items()))) for p in parts)
        specs.append(OptimizerSpec(kind, groups))
    return tuple(specs)


# -- program strategies -----------------------------------------------------------------------


# Programs are drawn once over these index ranges and fitted to a world by modulo (``_fit``): one
# strategy for every world, validated once. Building (and validating) a recursive strategy for each
# world's sizes cost ~40% of a world's time (docs/harness.md). The bounds are the worlds' own maxima:
# 4 optimizers, 12 parameters (5 layers of 2 and 2 loose), 7 loss terms.
_MAX_OPTIMIZERS, _MAX_PARAMS, _MAX_TERMS = 4, 12, 7


@functools.lru_cache(maxsize=1024)  # a mapped strategy is validated on its first draw: once per sizes
def programs(
    n_optimizers: int,
    n_params: int,
    n_terms: int,
    max_ops: int = 4,
    nesting: bool = True,
    faults: bool = True,
    hostile: bool = True,
) -> st.SearchStrategy[tuple[object, ...]]:
    """Random programs over the optimizers: blocks (every flag drawn), statements, user changes
    (``requires_grad``, the record), backward, faults and, with ``hostile``, stray untoggles, flags of
    other types and records replaced by the body.

    ``max_ops`` bounds each body (4: several blocks per world while a world stays a few ms);
    nesting is at most 3 deep (deeper adds time, not new paths).
    """
    return _programs(max_ops, nesting, faults, hostile).map(
        functools.partial(_fit_program, n_optimizers, n_params, n_terms)
    )


def _fit_program(n_opt: int, n_params: int, n_terms: int, program: tuple[object, ...]) -> tuple[object, ...]:
    return tuple(_fit(op, n_opt, n_params, n_terms) for op in program)


def _fit(op: object, n_opt: int, n_params: int, n_terms: int) -> object:
    """``op`` with its indices brought into a world's ranges (modulo); a loss's terms stay distinct."""
    if isinstance(op, Block):
        return dataclasses.replace(op, k=op.k % n_opt, body=_fit_program(n_opt, n_params, n_terms, op.body))
    if isinstance(op, Statement):
        return dataclasses.replace(op, k=op.k % n_opt, body=_fit_program(n_opt, n_params, n_terms, op.body))
    if isinstance(op, Backward):
        return Backward(tuple(dict.fromkeys(t % n_terms for t in op.terms)))
    if isinstance(op, SetRequiresGrad):
        return SetRequiresGrad(op.param % n_params, op.value)
    if isinstance(op, Untoggle):
        return Untoggle(op.k % n_opt)
    if isinstance(op, BadFlag):
        return BadFlag(op.k % n_opt, op.flag, op.value)
    return op  # EditRecord (its entry is taken modulo the record's length), Raise, ReplaceRecord


@functools.cache  # building (and validating) a recursive strategy costs more than a draw
def _programs(max_ops: int, nesting: bool, faults: bool, hostile: bool) -> st.SearchStrategy[tuple[object, ...]]:
    k = st.integers(0, _MAX_OPTIMIZERS - 1)
    backward = st.builds(Backward, st.lists(st.integers(0, _MAX_TERMS - 1), max_size=3, unique=True).map(tuple))
    set_rg = st.builds(SetRequiresGrad, st.integers(0, _MAX_PARAMS - 1), st.booleans())
    raise_ = st.builds(Raise, st.sampled_from(["error", "error", "interrupt"]))
    edit_record = st.builds(EditRecord, st.integers(0, _MAX_PARAMS - 1),
                            st.sampled_from(["flip", "delete", "replace", "add"]))
    hostile_ops = [
        st.builds(Untoggle, k),
        # a value of another type for a flag: the kinds users pass by mistake, and one whose repr is
        # longer than an error message shows
        st.builds(BadFlag, k, st.sampled_from(list(FLAG_DEFAULTS)),
                  st.sampled_from([1, 0, None, "yes", 1.0, "y" * 100])),
        st.builds(ReplaceRecord, st.sampled_from(["dict", "subclass"]), st.sampled_from(["below", "above"])),
    ] if hostile else []
    leaf = st.one_of(backward, backward, set_rg, edit_record, *([raise_] if faults else []), *hostile_ops)
    fail = st.sampled_from([None] * 5 + ["zero_grad", "step", "step_after", *SYNC_FAULTS]) if faults else st.none()
    entry = st.sampled_from(ENTRY_POINTS)
    way = st.sampled_from(["with", *WAYS_IN])  # the with statement most often

    def bodies(inner: st.SearchStrategy[object]) -> st.SearchStrategy[tuple[object, ...]]:
        return st.lists(inner, max_size=max_ops).map(tuple)

    def block(body: st.SearchStrategy[object]) -> st.SearchStrategy[Block]:
        return st.builds(Block, k, bodies(body), fail, entry=entry, explicit=st.booleans(), way=way,
                         **{name: st.booleans() for name in FLAG_DEFAULTS})

    def extend(inner: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
        return st.one_of(block(inner), st.builds(Statement, k, bodies(inner), st.booleans()))

    flat_blocks = st.one_of(block(leaf), st.builds(Statement, k, bodies(leaf), st.booleans()))
    if nesting:
        inner = st.recursive(leaf, extend, max_leaves=8)
        top = st.one_of(extend(inner), set_rg, backward)
    else:
        top = st.one_of(flat_blocks, flat_blocks, set_rg, backward)
    return st.lists(top, min_size=1, max_size=max_ops).map(tuple)


@st.composite
def overrides(draw: st.DrawFn, n_params: int) -> Overrides:
    """A user's own methods: either or both, each calling ``super()``, Lightning's own method or
    neither, each writing up to two parameters' ``requires_grad`` after it (any parameter, in an
    optimizer or not); the toggle passing flags of its own to ``super()``; set on the class or on the
    instance; plain functions or ``functools.wraps`` wrappers (in both import orders)."""
    sets = st.lists(st.tuples(st.integers(0, n_params - 1), st.booleans()), max_size=2).map(tuple)
    toggle = draw(st.sampled_from([None, "super", "super", "none", "own", "original"]), label="toggle override")
    kinds = ["super", "super", "own", "original"]
    untoggle = draw(st.sampled_from([None, *kinds] if toggle else kinds), label="untoggle override")
    # each flag at most once, any value (two at most: every one of them is drawn in turn)
    flags = st.dictionaries(st.sampled_from(sorted(FLAG_DEFAULTS)), st.booleans(), max_size=2)
    super_flags = tuple(sorted(draw(flags).items())) if toggle in ("super", "none") else ()
    return Overrides(toggle, untoggle, draw(sets) if toggle else (), draw(sets) if untoggle else (), super_flags,
                     on_instance=draw(st.booleans(), label="on the instance"),
                     wraps=draw(st.sampled_from([None, None, "original", "ours"]), label="functools.wraps of"))


def _method_entry_works(program: tuple[object, ...]) -> tuple[object, ...]:
    """An override of ``toggle_optimizer`` that returns None cannot be a ``with`` target: its blocks
    are opened through ``toggleshim.toggle`` (as the README says)."""

    def fix(op: object) -> object:
        if isinstance(op, (Block, Statement)):
            body = tuple(fix(o) for o in op.body)
            if isinstance(op, Block) and op.entry == "method":
                return dataclasses.replace(op, body=body, entry="toggle")
            return dataclasses.replace(op, body=body)
        return op

    return tuple(fix(op) for op in program)


def n_parameters(graph: GraphSpec) -> int:
    """Distinct parameters the graph's module has (ties collapse, as ``named_parameters`` does)."""
    tied = {d for d, _ in graph.ties}
    count = 0
    for i, layer in enumerate(graph.layers):
        weight = 0 if i in tied else 1
        if layer.kind in ("embedding",):
            count += weight
        elif layer.kind == "batchnorm":
            count += weight + 1
        else:
            count += weight + (1 if layer.bias else 0)
    return count + len(graph.loose)


@st.composite
def worlds(
    draw: st.DrawFn, nesting: bool = True, faults: bool = True, max_optimizers: int = 4, max_ops: int = 4,
    hostile: bool = True, user_class: bool = False,
) -> WorldSpec:
    """A whole world: graph -> frozen parameters -> optimizer partition -> program; with
    ``user_class``, the module's class overrides toggle/untoggle_optimizer (:func:`overrides`)."""
    graph = draw(graphs())
    n = n_parameters(graph)
    frozen = tuple(draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True)))
    optimizers = draw(optimizer_partitions(n, max_optimizers))
    n_terms = len(graph.layers) + len(graph.loose)
    program = draw(
        programs(len(optimizers), n, n_terms, max_ops=max_ops, nesting=nesting, faults=faults, hostile=hostile)
    )
    # which optimizers the program passes as LightningOptimizer (the kind of object users pass)
    wrapped = tuple(k for k in range(len(optimizers)) if draw(st.booleans()))
    container = draw(st.sampled_from(["list", "list", "tuple", "list subclass"])) if hostile else "list"
    drawn = draw(overrides(n)) if user_class else None
    if drawn is not None and drawn.toggle in ("none", "own", "original"):
        program = _method_entry_works(program)
    return WorldSpec(graph, frozen, optimizers, program, wrapped, container, drawn)


# -- hand-picked worlds every run includes (Hypothesis ``@example``) ----------------------------

_SGD = (("lr", 0.1), ("momentum", 0.9), ("weight_decay", 0.0))
_ADAM = (("amsgrad", False), ("lr", 0.01), ("weight_decay", 0.0))
# Two linear layers, weight+bias each: parameters 0..3; parameter 1 is in both optimizers.
_TWO = GraphSpec((LayerSpec("linear", (2, 2)), LayerSpec("linear", (2, 2))), seed=7)
_SHARED = (OptimizerSpec("sgd", (((0, 1), _SGD),)), OptimizerSpec("adam", (((1, 2, 3), _ADAM),)))
_LOOSE = (OptimizerSpec("sgd", (((0,), _SGD),)), OptimizerSpec("adam", (((1, 2), _ADAM),)))  # 3 is loose
# A model with hundreds of parameter tensors (a ResNet-50 has 161, a BERT-base 199, larger ones more):
# the two layers and 300 loose scalars, 304 parameters; optimizer 0 holds 262 of them (its place in the
# layout is 262), optimizer 1 the 43 others and the shared one. Counts and positions past 256, where
# CPython's small integers stop being one object: a comparison of two of them by identity (``is``)
# instead of by value would still hold below (the small worlds drawn never get there).
_MANY = GraphSpec(_TWO.layers, loose=(1,) * 300, seed=7)
_MANY_OPTS = (OptimizerSpec("sgd", (((0, 1, *range(4, 264)), _SGD),)),
              OptimizerSpec("adam", (((1, 2, 3, *range(264, 304)), _ADAM),)))

#: Flat worlds that touch each documented rule once: a user-frozen parameter, a shared parameter,
#: a user change inside a block, an interrupt and a failing step,
#: the record edited inside a block (a value, then a key), gradient sync off and its context failing.
FLAT_EXAMPLES = (
    WorldSpec(_TWO, (0,), _SHARED, (Block(1, (Backward((0, 1)),)), Block(0, (Backward((1,)),)))),
    WorldSpec(_TWO, (), _SHARED, (Block(0, (SetRequiresGrad(1, False), Backward((0,)))), Block(1))),
    WorldSpec(_TWO, (), _SHARED, (Block(1, (Backward((1,)), Raise("interrupt"))), Block(1, fail="step"))),
    WorldSpec(_TWO, (), _SHARED, (Backward((0, 1)), Block(0, zero_grad=False, step=False), Block(1, fail="zero_grad"))),
    WorldSpec(_TWO, (), _SHARED, (Block(0, (SetRequiresGrad(0, False),)), Block(0), Block(1, (Backward((1,)),)))),
    WorldSpec(_TWO, (), _SHARED, (Block(0), Block(0, (EditRecord(3, "flip"),)), Block(1, (EditRecord(0, "replace"),)))),
    # A key replaced by a loose parameter's, the values unchanged in order ([T, T, F]): only the keys
    # tell that Lightning's untoggle no longer restores parameter 2, set trainable inside the block.
    WorldSpec(_TWO, (2,), _LOOSE, (Block(0), Block(0, (SetRequiresGrad(2, True), EditRecord(2, "replace"))))),
    # The same optimizer toggled again after the user unfroze one of its managed parameters: the
    # record holds the new value (a cached record reused for other values would not)
    WorldSpec(_TWO, (2,), _SHARED, (Block(0), SetRequiresGrad(2, True), Block(0))),
    # sync_grad=False: sync blocked inside, back on at every exit (a clean one, an error, a failing
    # step); optimizer 1 passed as a LightningOptimizer (its step hooks, the global step)
    WorldSpec(_TWO, (), _SHARED, (Block(1, (Backward((1,)),), sync_grad=False), Block(0, (Raise(),), sync_grad=False),
                                  Block(1, fail="step", sync_grad=False), Block(1, fail="step_after")), (1,)),
    # The strategy's no-sync context fails: it cannot be made or entered (no zero_grad, no body; never
    # left), or leaving it fails (left once; after a clean body its error comes out, after the body's
    # error the body's)
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Backward((0,)),), fail="sync_call", sync_grad=False),
                                  Block(1, (Backward((1,)),), fail="sync_enter", sync_grad=False),
                                  Block(1, (Backward((1,)),), fail="sync_exit", sync_grad=False),
                                  Block(0, (Raise(),), fail="sync_exit", sync_grad=False)), (1,)),
    # Every entry point with no flag passed (its defaults: zero_grad on gradients a backward left,
    # step on the clean exit, gradient sync on), then with every flag passed
    WorldSpec(_TWO, (), _SHARED, (Backward((0, 1)), Block(0, (Backward((0,)),), entry="Toggle"), Backward((0, 1)),
                                  Block(1, (Backward((1,)),), entry="toggle"), Backward((0, 1)),
                                  Block(0, (Backward((0,)),), zero_grad=False, step=False, sync_grad=False,
                                        entry="Toggle", explicit=True),
                                  Block(1, (Backward((1,)),), entry="toggle", explicit=True)), (1,)),
    # The record edited inside a block over a LightningOptimizer, after the user froze one of the
    # block's own parameters: the exit is Lightning's untoggle over the edited record, which restores
    # the other optimizers' parameters only (the block's own is the torch optimizer inside the wrapper)
    WorldSpec(_TWO, (), _SHARED, (Block(0, (SetRequiresGrad(0, False), EditRecord(3, "flip"))),), (0,)),
    # hundreds of parameters: a user-frozen one, one set inside a block, shared ones, both optimizers
    WorldSpec(_MANY, (5, 270), _MANY_OPTS, (Block(1, (SetRequiresGrad(300, False), Backward((0, 1, 300)))),
                                            Block(0, (Backward((1, 7)),)), Block(1)), (1,)),
    # the record replaced inside a flat block by a dict subclass holding the same entries: the exit is
    # Lightning's untoggle reading it, lookup by lookup (the fast path trusts a plain dict alone)
    WorldSpec(_TWO, (), _SHARED, (Block(0, (ReplaceRecord("subclass"), Backward((0, 1)))),)),
)
#: User classes: fine-tuning code that re-freezes parameter 0 after every untoggle (calling super()),
#: an untoggle of its own (no super(): everything trainable again), a toggle that returns super()'s
#: result and freezes a parameter, one that returns None (a block through toggleshim.toggle), both.
USER_CLASS_EXAMPLES = (
    WorldSpec(_TWO, (), _SHARED, (Block(1, (Backward((0, 1)),)), Block(0, (Backward((0, 1)),))),
              overrides=Overrides(untoggle="super", untoggle_sets=((0, False),))),
    WorldSpec(_TWO, (3,), _SHARED, (Block(0, (Backward((0,)),)), Statement(1, (Backward((1,)),)), Block(1)),
              overrides=Overrides(untoggle="own", untoggle_sets=((3, True), (2, True)))),
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Block(1, (Backward((1,)),)),)), Block(1, entry="Toggle")),
              overrides=Overrides(toggle="super", toggle_sets=((2, False),))),
    WorldSpec(_TWO, (), _SHARED,
              (Block(0, (Backward((0,)),), entry="toggle"), Statement(1, (Block(0, entry="toggle"),))),
              overrides=Overrides(toggle="none", untoggle="super", toggle_sets=((1, False),),
                                  untoggle_sets=((0, False),))),
    # a stray untoggle of the block's own optimizer inside it (flat, then nested): the user's untoggle
    # is called there and again at the exit; the stray one is never the block's exit
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Untoggle(0), Backward((0,)))), Block(0, (Block(1, (Untoggle(1),)),))),
              overrides=Overrides(untoggle="super", untoggle_sets=((2, True),))),
    # issue 35's families, each found by hand first: flags an override passes to super() (gradient
    # accumulation in the override) through toggleshim.toggle, returned or not; methods set on the
    # instance (mock.patch.object); functools.wraps wrappers of Lightning's own method made before
    # import toggleshim (they call it: the module's own toggle) and of toggleshim's made after
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Backward((0, 1)),), entry="toggle"), Block(1, (Backward((0, 1)),))),
              overrides=Overrides(toggle="super", untoggle="super",
                                  super_flags=(("step", False), ("zero_grad", False)))),
    WorldSpec(_TWO, (), _SHARED, (Block(1, (Backward((0, 1)),), entry="toggle", step=True, explicit=True),
                                  Block(0, (Backward((0, 1)),), entry="toggle")),
              overrides=Overrides(toggle="none", super_flags=(("step", False),))),
    WorldSpec(_TWO, (), _SHARED,
              (Block(0, (Backward((0,)),)), Statement(1, (Backward((1,)),)), Block(1, entry="toggle")),
              overrides=Overrides(toggle="super", untoggle="super", untoggle_sets=((0, False),), on_instance=True)),
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Backward((0, 1)),), entry="toggle"), Block(1, entry="toggle")),
              overrides=Overrides(toggle="original", untoggle="original", wraps="original")),
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Block(1, (Backward((1,)),)),)), Block(1, entry="toggle")),
              overrides=Overrides(toggle="super", untoggle="super", wraps="ours", on_instance=True)),
)
#: Nested worlds: a block inside a block, a statement toggle left open inside a block, a block inside
#: a statement toggle (the statement's optimizer shares a parameter with the block's; one the
#: statement left live frozen by the user before the block, which then must see it frozen).
NESTED_EXAMPLES = (
    WorldSpec(_TWO, (), _SHARED, (Statement(0, (Block(1, (Backward((1,)),)),)),)),
    # a block whose step fails, around a block that completes: the fault waits for the step it is for
    # (the harness's one fault slot was cleared by the inner block, and the step ran for real)
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Block(0, (Block(0, zero_grad=False, step=False),), fail="step"),)),)),
    WorldSpec(_TWO, (), _SHARED,
              (Statement(0, (SetRequiresGrad(1, False), Block(1, (Backward((1,)),)), Backward((0,)))),)),
    # an exception leaves the statement open: the next block nests inside it
    WorldSpec(_TWO, (), _SHARED, (Statement(1, (Raise(),)), Block(0, (Backward((0,)),)), Block(1))),
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Block(1, (Backward((1,)),)), Backward((0,)))),)),
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Statement(1, (Raise(),)),)), Block(1, (Backward((1,)),)))),
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Statement(1, (Backward((1,)),)), Backward((0,)))),)),
    # a sync_grad=True block inside a sync_grad=False one: still blocked; back on after the outer
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Block(1, (Backward((1,)),)), Raise()), sync_grad=False),), (0, 1)),
    # a block stepped inside a block over the same optimizer (the outer refuses its second step) whose
    # no-sync exit then fails: the refusal, raised first, comes out
    WorldSpec(_TWO, (), _SHARED, (Block(0, (Block(0, sync_grad=False),), fail="sync_exit", sync_grad=False),), (0,)),
    # a statement toggle's record edited before a block inside it: replaced (it is no longer the
    # statement's: the block is Lightning's flat toggle), a key deleted or replaced (in number or in
    # identity: every recorded parameter shows what it recorded)
    WorldSpec(_TWO, (), _SHARED, (Statement(0, (ReplaceRecord("dict"), Block(1, (Backward((1,)),)))),)),
    WorldSpec(_TWO, (), _SHARED, (Statement(0, (ReplaceRecord("dict", "above"), Block(1, (Backward((1,)),)))),)),
    WorldSpec(_TWO, (), _SHARED, (Statement(0, (EditRecord(0, "delete"), Block(1, (Backward((1,)),)))),)),
    WorldSpec(_TWO, (), _SHARED, (Statement(0, (EditRecord(3, "delete"), SetRequiresGrad(1, False),
                                                Block(1, (Backward((1,)),)))),)),
    WorldSpec(_TWO, (), _SHARED, (Statement(1, (EditRecord(0, "replace"), Block(0, (Backward((0,)),)))),)),
    # a parameter the statement froze (it was frozen before) made trainable by the user, then a block
    # inside the statement over an optimizer holding it: the block sees what the statement recorded
    WorldSpec(_TWO, (2,), _SHARED, (Statement(0, (SetRequiresGrad(2, True), Block(1, (Backward((1,)),)))),)),
    # a key added to a statement toggle's record (a loose parameter's), then the user freezes the
    # statement's own parameter and a block over the same optimizer starts inside it: a record edited in
    # number, so the block sees what the statement recorded for it, not its current value
    WorldSpec(_TWO, (), _LOOSE, (Statement(0, (EditRecord(0, "add"), SetRequiresGrad(0, False),
                                               Block(0, (Backward((0,)),)))),)),
    # hundreds of parameters, a record of 304 keys left as the statement made it: the user freezes one
    # of the statement's own parameters, then a block inside it over the same optimizer sees it frozen
    WorldSpec(_MANY, (), _MANY_OPTS, (Statement(0, (SetRequiresGrad(200, False), Block(0, (Backward((0,)),)))),)),
)
