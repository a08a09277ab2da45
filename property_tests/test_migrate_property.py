"""Property: ``toggleshim migrate`` never changes what a drawn statement-style ``training_step`` does.

Hypothesis draws straight-line programs (spans toggle ... untoggle over two optimizers, spelled as
a name, an index or an attribute, holding zero_grad / backward / step / observe / inert lines /
user changes to ``requires_grad`` / conditional zero_grad and step in any order; lines outside the
spans; and constructs that must not be migrated: a return inside a span, overlapping toggles, a
conditional untoggle). Each program is rendered as the source of a LightningModule, migrated, and
both run three steps on a stand-in trainer (the original on Lightning's own methods, the migrated
one on the patch). Required: the migrated source parses, a second migration changes nothing, the
worlds are bitwise identical, every clean span became a block, and with the flags an independent
restatement of the rules expects. ``tests/test_migrate_trainer.py`` covers the real ``Trainer.fit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from _migrate_world import (  # tests/ is on pytest's pythonpath
    assert_same_world,
    migrated,
    on_stand_in,
    render,
    to_lightning,
)
from hypothesis import example, given
from hypothesis import strategies as st

from toggleshim._migrate import migrate_source, to_lightning_source

# how each optimizer may be written (index k): a name bound from self.optimizers(), an index, an attribute
SPELLINGS = (("g_opt", "opts[0]", "self.o0"), ("d_opt", "opts[1]", "self.o1"))
PRELUDE = (
    "self.o0, self.o1 = g_opt, d_opt\ntag = 0\n"
    'rspy, wspy, sspy = Spy(self, opts, "read"), Spy(self, opts, "write"), Spy(self, opts, "state")\n'
)
# inert by the rules: literals, bound to plain names (unpacking a display of as many elements)
INERT = ("tag = 1", "pass", "flag, other = True, (1, 'x')", 'tag = ("a: " "b")', "...", "tag = -1.5")
# not inert: each form runs user code (the template's Spy: reads or changes gradients, parameters
# and optimizer state); S is a reading or a writing spy (drawn), or one writing optimizer state alone
SPY_FORMS = (
    'tag = f"{S}"',
    'tag = ("a: " f"{S}")',
    'tag = f"{0:{S}}"',
    'f"{S!r}"',
    'tag = (1, f"{S}")',
    "a, b = S",
    "[a, b] = S",
    "a, *b = S",
    "tag = S.value",
    "tag = S[0]",
    "tag = S == 1",
    "tag = S < 1",
    "tag = S + 0",
    "tag = not S",
    "S()",
)
SPIES = ("rspy", "wspy", "sspy")  # Spy's modes read, write, state (tests/_migrate_world.py)


def spy_arg(form: str, spy: str) -> int:
    """The argument of the ``spy`` op that renders ``form`` on ``spy``."""
    return SPY_FORMS.index(form) + len(SPY_FORMS) * SPIES.index(spy)


@dataclass(frozen=True)
class Span:
    """``toggle(opt k)`` (spelled ``spelling``), ``ops``, ``untoggle``; ``kind``: clean or a refusal."""

    k: int
    spelling: int
    ops: tuple[tuple[str, int], ...]  # (op, argument)
    kind: str = "clean"  # clean, return, overlap, conditional-untoggle


def _op_line(op: str, arg: int, k: int) -> str:
    spelled = SPELLINGS[k][arg % 3]
    return {
        "zero_grad": f"{spelled}.zero_grad()",
        "step": f"{spelled}.step()",
        "backward": f"self.loss(x, {arg % 2}).backward()",
        "observe": "self.observe()",
        "inert": INERT[arg % len(INERT)],
        "requires_grad": f"self.a.bias.requires_grad_({arg % 2 == 0})",
        "if_zero_grad": f"if batch_idx % 2 == {arg % 2}:\n    {spelled}.zero_grad()",
        "if_step": f"if batch_idx % 2 == {arg % 2}:\n    {spelled}.step()",
        "spy": SPY_FORMS[arg % len(SPY_FORMS)].replace("S", SPIES[arg // len(SPY_FORMS) % len(SPIES)]),
    }[op]


# Bounds: up to 6 lines a span and 4 items a program keep each example ~10 ms of torch work.
OPS = st.tuples(
    st.sampled_from(
        ["zero_grad", "step", "backward", "observe", "inert", "requires_grad", "if_zero_grad", "if_step", "spy"]
    ),
    st.integers(0, 2 * len(SPY_FORMS) - 1),  # the spies drawn: reading and writing (state: see below)
)
SPANS = st.builds(
    Span,
    k=st.integers(0, 1),
    spelling=st.integers(0, 2),
    ops=st.lists(OPS, max_size=6).map(tuple),
    kind=st.sampled_from(["clean"] * 6 + ["return", "overlap", "conditional-untoggle"]),
)
ITEMS = st.one_of(SPANS, st.tuples(st.sampled_from(["backward", "observe", "requires_grad", "zero_grad"]),
                                   st.integers(0, 5), st.integers(0, 1)))
PROGRAMS = st.lists(ITEMS, min_size=1, max_size=4).map(tuple)


def _render_span(span: Span) -> list[str]:
    x = SPELLINGS[span.k][span.spelling]
    lines = [f"self.toggle_optimizer({x})"] + [_op_line(op, arg, span.k) for op, arg in span.ops]
    if span.kind == "return":
        lines.insert(len(lines) // 2 + 1, "if batch_idx > 99:\n    return")
    if span.kind == "overlap":  # the other optimizer toggled while this one is open (Lightning's nesting)
        other = SPELLINGS[1 - span.k][0]
        lines.insert(1, f"self.toggle_optimizer({other})\nself.loss(x, 0).backward()\nself.untoggle_optimizer({other})")
    if span.kind == "conditional-untoggle":
        lines.append(f"if batch_idx >= 0:\n    self.untoggle_optimizer({x})")
    else:
        lines.append(f"self.untoggle_optimizer({x})")
    return lines


def render_program(program: tuple[object, ...]) -> str:
    """The module of a program of spans and lines; with blocks written by hand (``Block``, the way
    back), ``import toggleshim`` too, and the name a flag may be."""
    blocks = any(isinstance(item, Block) for item in program)
    lines = [PRELUDE + "flag = True\n" * blocks]
    for item in program:
        if isinstance(item, Block):
            lines += _render_block(item)
        elif isinstance(item, Span):
            lines += _render_span(item)
        else:
            op, arg, k = item  # type: ignore[misc]
            lines.append(_op_line(op, arg, k))
    lines.append("self.observe()")
    docstring, rest = render("\n".join(lines)).split("\n", 1)
    imports = "import toggleshim\n" if blocks else ""
    return f"{docstring}\n{imports}{rest}"


def expected_with(span: Span) -> str:
    """The rules, restated independently: zero_grad is taken over when, apart from inert lines, the
    first line is ``X.zero_grad()`` spelled as in the toggle; step when the last is ``X.step()`` and no
    other line steps (the block refuses a step inside a block that steps on exit)."""
    x = SPELLINGS[span.k][span.spelling]
    real = [(i, op, arg) for i, (op, arg) in enumerate(span.ops) if op != "inert"]
    zg = bool(real) and real[0][1] == "zero_grad" and real[0][2] % 3 == span.spelling
    rest = real[1:] if zg else real
    step = bool(rest) and rest[-1][1] == "step" and rest[-1][2] % 3 == span.spelling
    step = step and not any(op in ("step", "if_step") for _, op, _ in rest[:-1])
    flags = [f"{n}=False" for n, on in (("zero_grad", zg), ("step", step)) if not on]
    return f"with self.toggle_optimizer({', '.join([x, *flags])}):"


CANONICAL = (Span(0, 0, (("zero_grad", 0), ("backward", 0), ("step", 0))),
             Span(1, 1, (("inert", 0), ("zero_grad", 1), ("backward", 1), ("step", 1), ("inert", 1))))


# Where a spy line goes (given the spy op's argument): the span, the flag its migration must keep,
# the call the flag keeps in the body.
SPY_PLACES: dict[str, tuple[Callable[[int], Span], str, str]] = {
    "toggle..zero_grad": (lambda arg: Span(0, 0, (("spy", arg), ("zero_grad", 0), ("backward", 0), ("step", 0))),
                          ", zero_grad=False", "g_opt.zero_grad()"),
    "step..untoggle": (lambda arg: Span(1, 0, (("zero_grad", 0), ("backward", 1), ("step", 0), ("spy", arg))),
                       ", step=False", "d_opt.step()"),
}

# issue 26: an f-string in an implicit concatenation and an unpacking were taken for inert
SPY_BEFORE_ZERO_GRAD = (SPY_PLACES["toggle..zero_grad"][0](spy_arg('tag = ("a: " f"{S}")', "rspy")),)
SPY_AFTER_STEP = (SPY_PLACES["step..untoggle"][0](spy_arg("a, b = S", "wspy")),)


@example(CANONICAL)
@example(SPY_BEFORE_ZERO_GRAD)
@example(SPY_AFTER_STEP)
@example((Span(0, 2, (("backward", 0), ("zero_grad", 2), ("step", 2), ("observe", 0))),))
@example((Span(1, 0, (("zero_grad", 0),), kind="overlap"), Span(0, 1, (), kind="return")))
@given(PROGRAMS)
def test_migration_keeps_the_world_bitwise(program: tuple[object, ...]) -> None:
    source = render_program(program)
    new = migrated(source)  # parses; idempotent
    withs = [line.strip() for line in new.splitlines() if line.strip().startswith("with self.toggle_optimizer")]
    # A toggle whose untoggle is conditional stays open, as far as the tool can tell, up to the next
    # untoggle statement of the list: the next span opens inside it and is not migrated.
    clean, still_open = [], False
    for span in (item for item in program if isinstance(item, Span)):
        if span.kind == "clean" and not still_open:
            clean.append(span)
        still_open = span.kind == "conditional-untoggle"
    assert withs == [expected_with(span) for span in clean]
    if not clean:
        assert new == source, "nothing to migrate, yet the file changed"
    assert_same_world(on_stand_in(source, patched=False), on_stand_in(new, patched=True))


def _moved(right: str, flag: str, call: str) -> str:
    """``right`` as a rule that took the spy line for inert would have written it: the flag dropped,
    the call moved into the block's entry or exit (across the spy line)."""
    assert flag + "):" in right and right.count(call + "\n") == 1, right
    return right.replace(flag + "):", "):").replace(call + "\n", "pass\n")


def _assert_right_and_moved_seen(program: tuple[object, ...], flag: str, call: str, right: str | None = None) -> None:
    """The migrated ``program`` (``right``, else migrated here) gives the original's world; moved, another."""
    source = render_program(program)
    right = migrated(source) if right is None else right
    before = on_stand_in(source, patched=False)
    assert_same_world(before, on_stand_in(right, patched=True))
    with pytest.raises(AssertionError):
        assert_same_world(before, on_stand_in(_moved(right, flag, call), patched=True))


def test_the_property_sees_a_spy_line_moved() -> None:
    """The comparison is not blind to the spies: a rewrite that moves zero_grad before a reading spy,
    or step before a writing one (what the old rules did), gives another world; so does a step moved
    before a line that changes nothing but optimizer state (``opt.state[p]``: SGD's momentum_buffer,
    Adam's exp_avg). (A state write commutes with zero_grad, which touches no optimizer state: before
    zero_grad the writing spy's ``.grad`` writes are what a move changes.)"""
    _assert_right_and_moved_seen(SPY_BEFORE_ZERO_GRAD, *SPY_PLACES["toggle..zero_grad"][1:])
    _assert_right_and_moved_seen(SPY_AFTER_STEP, *SPY_PLACES["step..untoggle"][1:])
    state_only = (SPY_PLACES["step..untoggle"][0](spy_arg("S()", "sspy")),)
    _assert_right_and_moved_seen(state_only, *SPY_PLACES["step..untoggle"][1:])


@pytest.mark.parametrize("place", list(SPY_PLACES))
@pytest.mark.parametrize("spy", ["rspy", "wspy"])
@pytest.mark.parametrize("form", SPY_FORMS)
def test_every_spy_form_keeps_its_call_in_place_and_a_move_is_seen(form: str, spy: str, place: str) -> None:
    """Every form of SPY_FORMS on both drawn spies in both places, every run (the ci profile's
    derandomized draws miss some): the migration keeps the call the line stands next to (the flag
    ``expected_with`` predicts), the migrated world is the original's, and the same span migrated as
    if the line were inert (the call moved across it) gives another world."""
    make, flag, call = SPY_PLACES[place]
    span = make(spy_arg(form, spy))
    assert expected_with(span).endswith(flag + "):")
    right = migrate_source(render_program((span,)).encode()).new.decode()  # one run (~0.1 s); idempotence: migrated()
    assert expected_with(span) in right, right
    _assert_right_and_moved_seen((span,), flag, call, right)


def test_the_property_migrates_something() -> None:
    """A check that checked nothing must fail: the canonical program does become two blocks."""
    new = migrated(render_program(CANONICAL))
    assert "with self.toggle_optimizer(g_opt):" in new and "with self.toggle_optimizer(opts[1]):" in new


# -- the way back (--to-lightning) ----------------------------------------------------------------


@example(CANONICAL)
@example((Span(0, 2, (("backward", 0), ("zero_grad", 2), ("step", 2), ("observe", 0))),))
@given(PROGRAMS)
def test_forward_and_back_keeps_the_world_bitwise(program: tuple[object, ...]) -> None:
    """Every block the forward direction writes goes back into Lightning's statements (no toggleshim
    left), and the module trains as the original, both without the patch."""
    source = render_program(program)
    home = to_lightning(migrated(source))  # parses; idempotent
    assert "toggleshim" not in home and "with self.toggle_optimizer" not in home, home
    assert_same_world(on_stand_in(source, patched=False), on_stand_in(home, patched=False))


@dataclass(frozen=True)
class Block:
    """``with <form>(opt k, flags)[ as blk]:`` over ``ops``; ``kind``: clean, or what the way back
    must decide (a return, an exception through the block, a nested block, sync_grad=False, a
    flag that is a name)."""

    k: int
    spelling: int
    zero_grad: bool
    step: bool
    form: str  # "method": self.toggle_optimizer(...), "toggle": toggleshim.toggle(self, ...)
    bind: bool  # `as blk`
    ops: tuple[tuple[str, int], ...]
    kind: str = "clean"


def expected_back(block: Block) -> list[bool]:
    """The rules of the way back, restated: which blocks become statements (in source order: a nested
    block, then the block inside it). A return leaves a block cleanly, and a block that steps on exit
    steps there; an exception is a block's own path; nesting stays blocks. sync_grad=False becomes the
    strategy's no-sync context around the statements, a flag that is a name their condition, unless the
    body rebinds the name (an inert line may: ``flag, other = ...``) (issue 44)."""
    if block.kind == "nested":
        return [False, False]
    if block.kind == "name-flag":
        return [not any(op == "inert" and INERT[arg % len(INERT)].startswith("flag,") for op, arg in block.ops)]
    return [block.kind in ("clean", "raise", "sync") or (block.kind == "return" and not block.step)]


def expected_program_back(program: tuple[object, ...]) -> list[bool]:
    """``expected_back`` for each block of a program, in source order; and after a statement toggle
    whose untoggle is conditional, every block stays one until the next untoggle that always runs
    (any other span's: Lightning's untoggle closes every statement toggle): the toggle may still be
    open around it, and Lightning's statement toggles nest differently from blocks."""
    decided: list[bool] = []
    maybe_open = False
    for item in program:
        if isinstance(item, Span):
            maybe_open = item.kind == "conditional-untoggle"
        elif isinstance(item, Block):
            decided += [back and not maybe_open for back in expected_back(item)]
    return decided


def _render_block(block: Block) -> list[str]:
    x = SPELLINGS[block.k][block.spelling]
    flags = [f"{name}=False" for name, on in (("zero_grad", block.zero_grad), ("step", block.step))
             if not on and not (name == "zero_grad" and block.kind == "name-flag")]  # (named once)
    flags += {"sync": ["sync_grad=False"], "name-flag": ["zero_grad=flag"]}.get(block.kind, [])
    args = ", ".join([x, *flags])
    call = f"self.toggle_optimizer({args})" if block.form == "method" else f"toggleshim.toggle(self, {args})"
    # a block that steps on exit refuses a step inside it (a RuntimeError): no step op in it
    ops = [("observe", arg) if block.step and op in ("step", "if_step") else (op, arg) for op, arg in block.ops]
    body = [_op_line(op, arg, block.k) for op, arg in ops]
    inserted = {
        "return": "if batch_idx == 1:\n    self.observe()\n    return",
        "raise": "if batch_idx == 1:\n    raise LookupError('through the block')",
        "nested": f"with self.toggle_optimizer({SPELLINGS[1 - block.k][0]}, zero_grad=False, step=False):\n"
        "    self.loss(x, 0).backward()",
    }.get(block.kind)
    if inserted is not None:
        body.insert(len(body) // 2, inserted)
    lines = [f"with {call}{' as blk' if block.bind else ''}:", *textwrap_indent(body or ["pass"])]
    if block.kind == "raise":
        lines = ["try:", *textwrap_indent(lines), "except LookupError:", "    self.observe()"]
    return lines


def textwrap_indent(lines: list[str]) -> list[str]:
    return ["    " + line for text in lines for line in text.split("\n")]


# Bounds: up to 5 lines a block and 4 items a program, as PROGRAMS (~10 ms of torch work an example).
BLOCKS = st.builds(
    Block,
    k=st.integers(0, 1),
    spelling=st.integers(0, 2),
    zero_grad=st.booleans(),
    step=st.booleans(),
    form=st.sampled_from(["method", "toggle"]),
    bind=st.booleans(),
    ops=st.lists(OPS, max_size=5).map(tuple),
    kind=st.sampled_from(["clean"] * 5 + ["return", "raise", "nested", "sync", "name-flag"]),
)
BLOCK_PROGRAMS = st.lists(st.one_of(BLOCKS, ITEMS), min_size=1, max_size=4).map(tuple)


@example((Block(0, 0, True, True, "method", False, (("backward", 0),)),
          Block(1, 1, False, True, "toggle", True, (("backward", 1), ("observe", 0)), kind="raise")))
@example((Block(0, 2, True, False, "method", False, (("backward", 0), ("step", 0)), kind="return"),
          Block(1, 0, True, True, "method", False, (("backward", 1),), kind="return")))
@example((Block(0, 1, True, True, "method", True, (("backward", 0),), kind="nested"),))
@example((Block(0, 0, False, False, "method", False, (), kind="name-flag"), Span(0, 0, (), kind="conditional-untoggle"),
          Block(0, 0, False, False, "method", False, ())))
@example((Span(0, 0, (), kind="conditional-untoggle"), Span(0, 0, ()), Block(0, 0, False, False, "method", False, ())))
@given(BLOCK_PROGRAMS)
def test_blocks_back_in_lightnings_statements_keep_the_world_bitwise(program: tuple[object, ...]) -> None:
    """Blocks written by hand, drawn (flags, forms, ``as``, returns, exceptions, nesting, spans
    around them), on the patch; and the file on its way back, without the patch where no block is
    left: the same world, bitwise. Which blocks go back is what ``expected_back`` predicts."""
    source = render_program(program)
    result = to_lightning_source(source.encode())
    home = to_lightning(source)  # parses; idempotent
    decided = [b.reason is None for b in result.blocks]
    assert decided == expected_program_back(program), [
        b.reason for b in result.blocks
    ]
    left = not all(decided)
    assert ("toggleshim" in home) == left, home
    assert_same_world(on_stand_in(source, patched=True), on_stand_in(home, patched=left))


def test_the_back_property_sees_a_step_dropped_and_an_untoggle_out_of_finally() -> None:
    """The comparison is not blind to the way back's two duties: a block's step on a clean exit (left
    out: another world), and its untoggle when an exception goes through it (outside ``finally``: the
    optimizers stay toggled after the exception, another world)."""
    stepping = (Block(0, 0, True, True, "method", False, (("backward", 0), ("observe", 0))),)
    raising = (Block(1, 0, True, False, "method", False, (("backward", 1),), kind="raise"),)
    for program, right_text, wrong_text in (
        (stepping, "            g_opt.step()\n", "            pass\n"),
        (raising, "            finally:\n                self.untoggle_optimizer(d_opt)\n",
         "            finally:\n                pass\n            self.untoggle_optimizer(d_opt)\n"),
    ):
        source = render_program(program)
        home = to_lightning(source)
        assert home.count(right_text) == 1, home
        before = on_stand_in(source, patched=True)
        assert_same_world(before, on_stand_in(home, patched=False))
        with pytest.raises(AssertionError):
            assert_same_world(before, on_stand_in(home.replace(right_text, wrong_text), patched=False))
