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

from dataclasses import dataclass

from _migrate_world import assert_same_world, migrated, on_stand_in, render  # tests/ is on pytest's pythonpath
from hypothesis import example, given
from hypothesis import strategies as st

# how each optimizer may be written (index k): a name bound from self.optimizers(), an index, an attribute
SPELLINGS = (("g_opt", "opts[0]", "self.o0"), ("d_opt", "opts[1]", "self.o1"))
PRELUDE = "self.o0, self.o1 = g_opt, d_opt\ntag = 0\n"
INERT = ("tag = 1", "pass", "flag, other = True, tag")


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
    }[op]


# Bounds: up to 6 lines a span and 4 items a program keep each example ~10 ms of torch work.
OPS = st.tuples(
    st.sampled_from(
        ["zero_grad", "step", "backward", "observe", "inert", "requires_grad", "if_zero_grad", "if_step"]
    ),
    st.integers(0, 5),
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
    lines = [PRELUDE]
    for item in program:
        if isinstance(item, Span):
            lines += _render_span(item)
        else:
            op, arg, k = item  # type: ignore[misc]
            lines.append(_op_line(op, arg, k))
    lines.append("self.observe()")
    return render("\n".join(lines))


def expected_with(span: Span) -> str:
    """The rules, restated independently: zero_grad is taken over when, apart from inert lines, the
    first line is ``X.zero_grad()`` spelled as in the toggle; step when the last is ``X.step()``."""
    x = SPELLINGS[span.k][span.spelling]
    real = [(i, op, arg) for i, (op, arg) in enumerate(span.ops) if op != "inert"]
    zg = bool(real) and real[0][1] == "zero_grad" and real[0][2] % 3 == span.spelling
    rest = real[1:] if zg else real
    step = bool(rest) and rest[-1][1] == "step" and rest[-1][2] % 3 == span.spelling
    flags = [f"{n}=False" for n, on in (("zero_grad", zg), ("step", step)) if not on]
    return f"with self.toggle_optimizer({', '.join([x, *flags])}):"


CANONICAL = (Span(0, 0, (("zero_grad", 0), ("backward", 0), ("step", 0))),
             Span(1, 1, (("inert", 0), ("zero_grad", 1), ("backward", 1), ("step", 1), ("inert", 1))))


@example(CANONICAL)
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


def test_the_property_migrates_something() -> None:
    """A check that checked nothing must fail: the canonical program does become two blocks."""
    new = migrated(render_program(CANONICAL))
    assert "with self.toggle_optimizer(g_opt):" in new and "with self.toggle_optimizer(opts[1]):" in new
