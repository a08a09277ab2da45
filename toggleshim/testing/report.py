"""Counterexamples a person can read: worlds rendered as short Python, snippets that run as printed,
difference lists bounded, and ``toggleshim check``'s failure report fitted to a screen.

* :func:`render` writes a spec as the Python that builds it, wrapped at :data:`WIDTH` columns, with
  defaults left out and long runs of integers folded (``(1,) * 300``, ``(0, 1, *range(4, 264))``):
  ``eval`` of it, with the names it uses imported from ``toggleshim.testing``, equals the spec.
* :func:`snippet`: the imports it needs, the spec, the checker's call (under
  :func:`toggleshim.testing.trusting_unverified` where the check tested unverified toggle code).
* :func:`bounded` / :func:`compact_record`: a difference list as a count and a few examples.
* :func:`world_size`: the order in which hand-picked worlds run (the smallest failing one is shown).
* :func:`failure_report`: the failures of a check within a line budget, the smallest world first.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "WIDTH",
    "Failure",
    "bounded",
    "compact_record",
    "failure_report",
    "render",
    "snippet",
    "trusting_unverified",
    "world_size",
]

#: the column a rendered snippet wraps at (a report line is never longer than ``MAX_LINE``)
WIDTH = 100
MAX_LINE = 1000
_RUN = 5  # integers in a row (equal, or counting up by one) folded into one expression from this many on


# -- rendering a spec as Python --------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    name: str
    args: tuple[tuple[str | None, Any], ...]  # (keyword or None for a positional argument, node)


@dataclass(frozen=True)
class _Seq:
    items: tuple[Any, ...]
    brackets: str  # "()" or "[]"


def _node(value: Any, names: set[str]) -> Any:
    """The value as a tree of calls, sequences and atoms (``str``: Python text), collecting in
    ``names`` the classes it uses."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names.add(type(value).__name__)
        return _Call(type(value).__name__, tuple((k, _node(v, names)) for k, v in _arguments(value)))
    if isinstance(value, tuple) and value and all(type(v) is int for v in value):
        return _ints(value)
    if isinstance(value, (tuple, list)):
        return _Seq(tuple(_node(v, names) for v in value), "()" if isinstance(value, tuple) else "[]")
    if isinstance(value, str) and len(value) >= 2 * _RUN and len(set(value)) == 1:
        return f"{value[0]!r} * {len(value)}"  # 'y' * 100
    return repr(value)


def _arguments(value: Any) -> list[tuple[str | None, Any]]:
    """The arguments that rebuild a spec: fields left at their default are left out; the leading
    fields are positional in a small spec (3 fields at most: ``Backward((0, 1))``), keywords after
    the first one left out and in a larger spec (``WorldSpec(graph=..., ...)``). ``Block`` is built
    as its own ``repr`` builds it (flags by name, only those that differ from their defaults)."""
    cls = type(value)
    if cls.__name__ == "Block" and hasattr(value, "changed"):
        args: list[tuple[str | None, Any]] = [(None, value.k)]
        if value.body:
            args.append((None, value.body))
        args += list(value.changed().items())
        for name, default in (("fail", None), ("entry", "method"), ("explicit", False), ("way", "with")):
            if getattr(value, name) != default:
                args.append((name, getattr(value, name)))
        return args
    fields = [f for f in dataclasses.fields(value) if f.init]
    positional = len(fields) <= 3
    args = []
    for f in fields:
        current = getattr(value, f.name)
        if f.default is not dataclasses.MISSING and current == f.default:
            positional = False
            continue
        if f.default_factory is not dataclasses.MISSING and current == f.default_factory():
            positional = False
            continue
        args.append((None if positional else f.name, current))
    return args


def _ints(values: tuple[int, ...]) -> str:
    """A tuple of integers with its runs folded: ``(1,) * 300``, ``(0, 1, *range(4, 264))``."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        same, counting = _run_end(values, i, 0), _run_end(values, i, 1)
        if same - i >= _RUN:
            parts.append(f"*({values[i]},) * {same - i}")
            i = same
        elif counting - i >= _RUN:
            parts.append(f"*range({values[i]}, {values[counting - 1] + 1})")
            i = counting
        else:
            parts.append(str(values[i]))
            i += 1
    if len(parts) == 1 and parts[0].startswith("*("):
        return parts[0][1:]  # (1,) * 300
    if len(parts) == 1 and parts[0].startswith("*range"):
        return f"tuple({parts[0][1:]})"
    return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"


def _run_end(values: tuple[int, ...], i: int, step: int) -> int:
    """Where the run from ``values[i]`` ends, each value ``step`` more than the one before."""
    j = i + 1
    while j < len(values) and values[j] == values[j - 1] + step:
        j += 1
    return j


def _flat(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, _Call):
        return f"{node.name}({', '.join(_argument(k, _flat(v)) for k, v in node.args)})"
    inner = ", ".join(_flat(v) for v in node.items)
    if node.brackets == "()" and len(node.items) == 1:
        inner += ","  # a tuple of one
    return f"{node.brackets[0]}{inner}{node.brackets[1]}"


def _argument(keyword: str | None, text: str) -> str:
    return text if keyword is None else f"{keyword}={text}"


def _lines(node: Any, indent: int, prefix: str = "", suffix: str = "") -> list[str]:
    """``node`` after ``prefix`` at column ``indent``: one line if it fits :data:`WIDTH`, else one
    argument (or item) a line, each wrapped the same way."""
    pad = " " * indent
    flat = f"{pad}{prefix}{_flat(node)}{suffix}"
    if isinstance(node, str) or len(flat) <= WIDTH:
        return [flat]
    if isinstance(node, _Call):
        opening, closing = f"{node.name}(", ")"
        parts: Iterable[tuple[str | None, Any]] = node.args
    else:
        opening, closing = node.brackets[0], node.brackets[1]
        parts = ((None, item) for item in node.items)
    lines = [f"{pad}{prefix}{opening}"]
    for keyword, child in parts:
        lines += _lines(child, indent + 4, "" if keyword is None else f"{keyword}=", ",")
    return [*lines, f"{pad}{closing}{suffix}"]


def render(spec: Any) -> str:
    """``spec`` as the Python expression that builds it, wrapped at :data:`WIDTH` columns."""
    return "\n".join(_lines(_node(spec, set()), 0))


def snippet(spec: Any, checker: str, flavour: str, trusting: bool = False) -> str:
    """A script that reproduces ``checker(spec, flavour)`` in a fresh interpreter: the imports it
    needs (every one from ``toggleshim.testing``, or where a class is not exported there, its own
    module), the spec, the call; with ``trusting``, the call runs the shim on toggle code it has not
    verified, as ``toggleshim check`` does."""
    from toggleshim import testing

    used: set[str] = set()
    tree = _node(spec, used)
    public = sorted(name for name in used if getattr(testing, name, None) is not None)
    elsewhere: dict[str, list[str]] = {}
    for name in sorted(used - set(public)):
        cls = _class_named(spec, name)
        elsewhere.setdefault(cls.__module__, []).append(name)
    imported = [*public, checker, *(["trusting_unverified"] if trusting else [])]
    lines = ["import toggleshim  # installs the shim", *_import("toggleshim.testing", imported)]
    for module, names in elsewhere.items():
        lines += _import(module, names)
    lines += _lines(tree, 0, "spec = ")
    call = f"{checker}(spec, {flavour!r})"
    if trusting:
        lines += [f"with trusting_unverified():  # the shim on {flavour}'s unverified toggle code", f"    {call}"]
    else:
        lines.append(call)
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def trusting_unverified() -> Iterator[None]:
    """Inside, toggleshim's block on every Lightning flavour whose methods are Lightning's own, also
    where their code is one toggleshim has not verified (which otherwise gets the fallback): what
    ``toggleshim check`` tests, and what a snippet it printed for such a flavour runs under.
    Afterwards every flavour is as it was."""
    from toggleshim import _patch

    with _patch._trusting():
        yield


def _import(module: str, names: Sequence[str]) -> list[str]:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= WIDTH:
        return [line]
    return [f"from {module} import (", *(f"    {n}," for n in names), ")"]


def _class_named(value: Any, name: str) -> type:
    """The class called ``name`` somewhere in ``value`` (a spec)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            if type(item).__name__ == name:
                return type(item)
            stack += [getattr(item, f.name) for f in dataclasses.fields(item)]
        elif isinstance(item, (tuple, list)):
            stack += list(item)
    raise LookupError(name)  # pragma: no cover - ``name`` came from ``value``


# -- sizes and bounded differences -------------------------------------------------------------------


def _ops(program: Iterable[object]) -> int:
    return sum(1 + _ops(getattr(op, "body", ())) for op in program)


def world_size(spec: Any) -> tuple[int, int, int, int]:
    """How big a world is to read: its parameters, then its operations (nested ones counted), its
    optimizers, and the length of its text. Hand-picked worlds run smallest first."""
    from toggleshim.testing.specs import n_parameters

    return n_parameters(spec.graph), _ops(spec.program), len(spec.optimizers), len(render(spec))


def bounded(items: Sequence[str], noun: str, limit: int = 3) -> str:
    """``items`` joined by ``; `` when there are at most ``limit``; else a count and the first ones:
    ``260 parameters differ, e.g. <item>; <item>; <item>; and 257 more``."""
    if len(items) <= limit:
        return "; ".join(items)
    return f"{len(items)} {noun} differ, e.g. {'; '.join(items[:limit])}; and {len(items) - limit} more"


def compact_record(record: Sequence[Any] | None, other: Sequence[Any] | None, limit: int = 160) -> str:
    """A record (``((parameter, value), ...)`` or None) as text, beside the ``other`` it differs from:
    itself when short, else its length and its first entries that differ from ``other``'s."""
    text = repr(record)
    if record is None or len(text) <= limit:
        return text
    theirs = list(other or ())
    differ = [e for i, e in enumerate(record) if i >= len(theirs) or theirs[i] != e]
    shown = ", ".join(repr(e) for e in differ[:3])
    more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
    return f"a record of {len(record)} entries" + (f", differing at {shown}{more}" if differ else "")


def clip(line: str, limit: int = MAX_LINE) -> str:
    """``line`` cut to ``limit`` characters, saying how many were left out."""
    if len(line) <= limit:
        return line
    note = " … ({} more characters: --json has them all)"
    keep = limit - len(note.format(len(line)))
    return line[:keep] + note.format(len(line) - keep)


# -- the check's failure report ------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """A failing property of ``toggleshim check``: where, what differs, and how to reproduce it.
    ``size``: its world's :func:`world_size` (None: no world, e.g. a flavour the gate left alone)."""

    flavour: str
    prop: str
    message: str
    snippet: str = ""
    size: tuple[int, ...] | None = None
    origin: str = ""  # "hand-picked world 2 of 13 (3 of them fail)", "random world, shrunk"


def failure_report(failures: Sequence[Failure], budget: int) -> list[str]:
    """The failures as lines, within ``budget`` lines however many there are: the same failure in
    several flavours once; the smallest world first, with its snippet, then the others with theirs
    while they fit, then one line each (``--json`` keeps every one)."""
    groups: dict[tuple[str, str], list[Failure]] = {}
    for f in failures:
        groups.setdefault((f.prop, f.message), []).append(f)
    ordered = sorted(groups.values(), key=lambda g: (g[0].size is None, g[0].size or ()))
    blocks = [_block(g) for g in ordered]
    lines: list[str] = []
    for i, block in enumerate(blocks):
        rest = len(blocks) - i - 1  # then at least a heading (2 lines) and a line each
        if len(lines) + len(block) + (rest + 2 if rest else 0) > budget:
            lines += ["", "Also failing (a counterexample: `check --property NAME`; every one: `check --json PATH`):"]
            lines += [_short(g) for g in ordered[i:]]
            break
        lines += block
    return [clip(line) for line in lines]


def _where(group: Sequence[Failure]) -> str:
    names = [f.flavour for f in group]
    return names[0] + (f" (the same in {', '.join(names[1:])})" if len(names) > 1 else "")


def _block(group: Sequence[Failure]) -> list[str]:
    first = group[0]
    if first.prop == "-":
        return ["", first.message]
    origin = f" [{first.origin}]" if first.origin else ""
    lines = ["", f"MISMATCH in {_where(group)} / {first.prop}{origin}: {first.message}"]
    if first.snippet:
        lines += ["Reproduce with:", "", *first.snippet.rstrip("\n").splitlines()]
    return lines


def _short(group: Sequence[Failure]) -> str:
    first = group[0]
    text = f"  {_where(group)} / {first.prop}: {first.message}"
    return text if len(text) <= WIDTH * 2 else text[: WIDTH * 2 - 1] + "…"

