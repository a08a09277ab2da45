"""The way back (``toggleshim migrate --to-lightning``): each toggleshim block of one file rewritten
into Lightning's own statements, only where exactly equivalent on every path, exceptions included::

    with R.toggle_optimizer(X[, zero_grad=Z][, step=S][, sync_grad=G])[ as N]:   # or toggleshim.toggle(R, X, ...)
        BODY

becomes::

    R.toggle_optimizer(X)
    try:
        with <no sync>:      # only where G is not True: the strategy's block_backward_sync() (below)
            X.zero_grad()        # when Z (the default); `if Z: X.zero_grad()` where Z is a name
            N = X                # with `as N`: the block yields X itself
            BODY
            X.step()             # when S (the default): after a clean BODY only; `if S: X.step()` for a name
    finally:
        R.untoggle_optimizer(X)

``<no sync>`` is what the block enters (toggleshim/_block.py, ``_no_sync``): the strategy's
``block_backward_sync()`` where it has one (DDP's ``no_sync``), nothing elsewhere, written
``getattr(R.trainer.strategy, "block_backward_sync", contextlib.nullcontext)()``; for a name G,
``contextlib.nullcontext() if G else`` that (``import contextlib`` added where missing). A flag may be
a literal ``True``/``False`` or a name (an attribute chain, a subscript by an int literal) the body does
not rebind: the block reads it once, at the ``with`` line, the statements where they use it.

That is what the block does, call for call (toggleshim/_block.py: toggle at the call; ``zero_grad``
on entry; ``step`` on a clean exit only; untoggle on every exit; the exception propagates), on
every Lightning >= 2.0. Where it cannot be proven (docs/migrate.md, "Back to Lightning", rules in
the order of :meth:`_Unmigrator.refusal`), the block is left as it is, with one line saying why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst

from toggleshim._migrate._imports import _from_toggleshim, _of_toggleshim
from toggleshim._migrate._program import _LIGHTNING_BASES, _Program
from toggleshim._migrate._syntax import (
    _TOGGLE,
    _UNTOGGLE,
    _code,
    _escape,
    _method_call,
    _nodes,
    _rebinds,
    _ref,
    _root,
    _same,
    _shadows_toggleshim,
    _single_arg,
    _toggle_line,
    _toggling,
)
from toggleshim._migrate._walk import _Walker

_FLAGS = ("zero_grad", "step", "sync_grad")


@dataclass
class _Block:
    """What the way back found for one block."""

    line: int
    text: str  # the block's call as written, e.g. ``self.toggle_optimizer(d_opt, step=False)``
    reason: str | None = None  # why it is left as it is (None: rewritten)


@dataclass
class _Call:
    """A block's call, read: ``R.toggle_optimizer(X, **flags)`` or ``toggleshim.toggle(R, X, **flags)``."""

    call: cst.Call
    through: bool  # the ``toggleshim.toggle`` form (it calls the module's own toggle_optimizer with X alone)
    args: list[cst.Arg]  # the positional arguments: [X], or [R, X] for toggleshim.toggle
    receiver: cst.BaseExpression | None  # R of ``R.toggle_optimizer``


def _statement(expr: cst.BaseExpression, **changes: Any) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(body=[cst.Expr(expr)], **changes)


def _method(obj: cst.BaseExpression, name: str, *args: cst.BaseExpression) -> cst.Call:
    """``obj.name(args...)``."""
    return cst.Call(func=cst.Attribute(value=obj, attr=cst.Name(name)), args=[cst.Arg(a) for a in args])


def _when(flag: bool | cst.BaseExpression, call: cst.Call, **changes: Any) -> cst.BaseStatement:
    """``call`` as a statement line (a literal True flag), or ``if flag: call`` (a name)."""
    if flag is True:
        return _statement(call, **changes)
    assert not isinstance(flag, bool)
    return cst.If(test=flag, body=cst.IndentedBlock(body=[_statement(call)]), **changes)


def _no_sync(recv: cst.BaseExpression, sync: bool | cst.BaseExpression) -> cst.BaseExpression:
    """What the block enters where ``sync_grad`` is not True: the strategy's ``block_backward_sync()``
    where it has one, nothing elsewhere (as ``toggleshim/_block.py``'s ``_no_sync`` reads it)."""
    strategy = cst.Attribute(value=cst.Attribute(value=recv, attr=cst.Name("trainer")), attr=cst.Name("strategy"))
    null = cst.Attribute(value=cst.Name("contextlib"), attr=cst.Name("nullcontext"))
    factory = cst.Call(func=cst.Name("getattr"), args=[
        cst.Arg(strategy), cst.Arg(cst.SimpleString('"block_backward_sync"')), cst.Arg(null)])
    entered = cst.Call(func=factory)
    if sync is False:
        return entered
    assert not isinstance(sync, bool)
    return cst.IfExp(test=sync, body=cst.Call(func=null), orelse=entered)


def _contextlib_taken(module: cst.Module) -> str | None:
    """Why the name ``contextlib`` may not be the standard module in ``module`` (None: it is, or unbound)."""
    for node in _nodes(module):
        if isinstance(node, cst.ImportFrom) and isinstance(node.names, Sequence) and any(
            _code(a.asname.name if a.asname else a.name).strip() == "contextlib" for a in node.names
        ):
            return f"bound by `{_code(node).strip()}`"
        if isinstance(node, cst.Import):
            for a in node.names:
                if a.asname is not None and _code(a.asname.name).strip() == "contextlib":
                    return f"bound by `{_code(node).strip()}`"
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node.name.value == "contextlib":
            return "the name of a def or class"
        target = node.target if isinstance(node, cst.AssignTarget) else None
        if isinstance(target, cst.Name) and target.value == "contextlib":
            return "assigned to"
    return None


def _bare_pass(stmt: cst.CSTNode) -> bool:
    """A ``pass`` line without a comment."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and all(isinstance(s, cst.Pass) for s in stmt.body)
        and stmt.trailing_whitespace.comment is None
        and all(line.comment is None for line in stmt.leading_lines)
    )


class _Unmigrator(_Walker):
    """Walks one module: finds toggleshim's blocks, decides each, rebuilds the changed lists; notes
    the other code that needs toggleshim (flags given to a statement toggle, its names)."""

    def __init__(self, module: cst.Module, positions: Any, program: _Program) -> None:
        super().__init__(module, positions, program)
        self.blocks: list[_Block] = []
        self.other: list[tuple[int, str]] = []  # other code that needs toggleshim: (line, what)
        self.rewritten = 0
        self.shadowed = _shadows_toggleshim(module)
        self.imported = _from_toggleshim(module)  # local name -> what it is in toggleshim
        self.items: set[int] = set()  # the calls of the blocks decided (their uses are the blocks')
        self.imports: list[int] = []  # the lines of the file's imports of toggleshim
        self.plain = 0  # `with R.toggle_optimizer(X)` blocks rewritten (they rely on the assumption)
        self.outside: set[str] = set()  # the bases from outside the run of their classes
        self.needs_contextlib = False  # a block with sync_grad was rewritten: `import contextlib` is needed
        self.contextlib_taken = _contextlib_taken(module)  # why `contextlib` is not the module here, if so

    # -- what a block is ---------------------------------------------------------------------

    def read(self, call: cst.BaseExpression) -> _Call | None:
        """The block's call, when ``call`` makes toggleshim's block; else None."""
        if not isinstance(call, cst.Call):
            return None
        positional = [a for a in call.args if a.keyword is None]
        found = _method_call(call)
        if found is not None and found[1] == _TOGGLE:
            return _Call(call, False, positional, found[0])
        if found is not None and found[1] in ("toggle", "Toggle") and _ref(found[0]) == "toggleshim":
            return _Call(call, True, positional, None)
        if isinstance(call.func, cst.Name) and self.imported.get(call.func.value) in ("toggle", "Toggle"):
            return _Call(call, True, positional, None)
        return None

    def visit(self, node: cst.CSTNode, outer: str | None) -> str | None:
        """Code outside the blocks decided that needs toggleshim, one line each."""
        if isinstance(node, (cst.Import, cst.ImportFrom)):  # what it binds is seen where it is used
            self.items.update(id(n) for n in _nodes(node))
            if _of_toggleshim(node):
                self.imports.append(self.line(node))
        if isinstance(node, cst.Name) and node.value in self.imported and id(node) not in self.items:
            self.other.append((self.line(node), f"`{node.value}` (from toggleshim) is used"))
        if isinstance(node, cst.Call) and id(node) not in self.items:
            found = _method_call(node)
            if found is not None and found[1] == _TOGGLE:
                if any(a.keyword is not None and a.keyword.value in _FLAGS for a in node.args):
                    self.other.append((self.line(node), f"`{_code(node).strip()}` is given toggleshim's flags"))
            elif self.read(node) is not None:
                self.other.append((self.line(node), f"`{_code(node).strip()}` outside a `with` statement"))
                self.items.add(id(node.func))  # said once
        if isinstance(node, cst.Attribute) and _ref(node.value) == "toggleshim" and id(node) not in self.items:
            self.other.append((self.line(node), f"`toggleshim.{node.attr.value}` is used"))
        if isinstance(node, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            for small in node.body:  # a toggle whose result is used: Lightning's returns None
                if isinstance(small, (cst.Expr, cst.Return)) and small.value and self.delegates(small.value):
                    continue
                for sub in _nodes(small):
                    found = _method_call(sub)
                    if found and found[1] == _TOGGLE and not (isinstance(small, cst.Expr) and small.value is sub):
                        self.other.append((self.line(sub), "the result of toggle_optimizer is used"))
        return super().visit(node, outer)

    # -- the statement lists -----------------------------------------------------------------

    def statement_list(self, node: cst.Module | cst.IndentedBlock, outer: str | None) -> cst.CSTNode:
        body = list(node.body)
        open_at: list[str | None] = [outer] * len(body)  # what is open around each statement
        for i, stmt in enumerate(body):
            found = _toggle_line(stmt, _TOGGLE)
            if found is None or self.delegates(found[1]):
                continue
            # open until its untoggle line in this list (the try right after it, when that untoggles)
            end = next((k for k in range(i + 1, len(body)) if _toggle_line(body[k], _UNTOGGLE) is not None), len(body))
            if self.finally_untoggles(body[i + 1] if i + 1 < len(body) else None, found):
                end = i + 2
            for k in range(i + 1, end):
                open_at[k] = open_at[k] or f"inside the statement toggle at line {self.line(stmt)}"
        out: list[Any] = []
        for k, stmt in enumerate(body):
            replaced = self.block(stmt, open_at[k]) if isinstance(stmt, cst.With) else None
            out += replaced if replaced is not None else [self.walk(stmt, open_at[k])]
        if len(out) == len(body) and all(a is b for a, b in zip(out, body)):
            return node
        return node.with_changes(body=out)

    @staticmethod
    def finally_untoggles(stmt: cst.CSTNode | None, found: tuple[cst.BaseExpression, cst.Call]) -> bool:
        """``stmt`` is a ``try`` whose ``finally`` untoggles what ``found`` toggled."""
        if not isinstance(stmt, cst.Try) or stmt.finalbody is None:
            return False
        for s in stmt.finalbody.body.body:
            u = _toggle_line(s, _UNTOGGLE)
            if u is not None and _same(u[0], found[0]) and _same(_single_arg(u[1]), _single_arg(found[1])):
                return True
        return False

    def block(self, stmt: cst.With, outer: str | None) -> list[cst.BaseStatement] | None:
        """The statements for a block (None: not toggleshim's block, or left as it is)."""
        read = self.read(stmt.items[0].item)
        if read is None:
            return None
        self.items.add(id(read.call))
        self.items.add(id(read.call.func))
        found = _Block(self.line(stmt), _code(read.call).strip())
        self.blocks.append(found)
        found.reason = self.refusal(stmt, read, outer)
        if found.reason is not None:
            return None
        self.rewritten += 1
        if read.receiver is not None:
            self.plain += 1
            self.outside |= self.program.relevant(self.receiver_class(read.receiver))[1] - _LIGHTNING_BASES
        return self.statements(stmt, read)

    # -- the rules, in order -------------------------------------------------------------------

    def refusal(self, stmt: cst.With, read: _Call, outer: str | None) -> str | None:
        """Why the block cannot become Lightning's statements (None: it can)."""
        if outer is not None:
            return f"it is {outer}: Lightning's statement toggles nest differently from blocks"
        if len(stmt.items) != 1 or stmt.asynchronous is not None:
            return "the `with` enters more than the toggle"
        call = read.call
        if any(a.star for a in call.args) or len(read.args) != (2 if read.through else 1):
            return "the call is not given exactly the module and the optimizer (positionally) and flags"
        flags: dict[str, bool | None] = {}  # None: a name, true or false when the block runs
        named: list[cst.BaseExpression] = []
        for arg in call.args:
            if arg.keyword is None:
                continue
            name = arg.keyword.value
            if name not in _FLAGS:
                return f"`{name}=` is not one of toggleshim's flags"
            value = arg.value
            if isinstance(value, cst.Name) and value.value in ("True", "False"):
                flags[name] = value.value == "True"
                continue
            if _ref(value) is None:
                return (
                    f"`{name}={_code(value).strip()}` is neither a literal True or False nor a name (the block reads "
                    "it once, at the `with` line; the statements would read it again where they use it: bind it to "
                    "a name before the block)"
                )
            flags[name] = None
            named.append(value)
        if flags.get("sync_grad", True) is not True and self.contextlib_taken is not None:
            return f"sync_grad: `contextlib` is {self.contextlib_taken} here (the statements need the module)"
        if read.through and self.shadowed is not None:
            return f"`toggleshim` may not be the package here: {self.shadowed}"
        recv = read.args[0].value if read.through else read.receiver
        opt = read.args[-1].value
        assert recv is not None
        for expr in (opt, recv):
            if _ref(expr) is None:
                return (
                    f"`{_code(expr).strip()}` is evaluated once by the block, at each use by the statements: it may "
                    "not be the same object each time (allowed: a name, an attribute chain on a name, a subscript "
                    "by an int literal)"
                )
        target = self.as_target(stmt.items[0], opt, recv)
        if target is not None:
            return target
        body = self.body(stmt)
        return self.body_refusal(body, opt, recv, flags, named) or (
            None if read.through else self.overridden(recv, flags))

    def as_target(self, item: cst.WithItem, opt: cst.BaseExpression, recv: cst.BaseExpression) -> str | None:
        """Why ``as N`` cannot become ``N = X`` (None: it can, or there is none)."""
        if item.asname is None:
            return None
        name = item.asname.name
        if not isinstance(name, cst.Name):
            return f"`as {_code(name).strip()}`: only a plain name is rewritten"
        if name.value in {_root(opt), _root(recv)} and not _same(name, opt):
            return f"`as {name.value}` rebinds a name the toggle's expressions start from"
        return None

    def body_refusal(
        self, body: Sequence[cst.CSTNode], opt: cst.BaseExpression, recv: cst.BaseExpression,
        flags: dict[str, bool | None], named: Sequence[cst.BaseExpression] = (),
    ) -> str | None:
        """Why the body keeps the block from being the statements."""
        for stmt in body:
            for sub in _nodes(stmt):
                m = _method_call(sub)
                if (m is not None and _toggling(m)) or (isinstance(sub, cst.Call) and self.read(sub) is not None):
                    what = m[1] if m is not None else "toggle"
                    return f"a {what} call (line {self.line(sub)}) inside the block would nest"
        if flags.get("step", True) is not False:  # True, or a name that may be true
            escape = next(filter(None, (_escape(s, suspends=False) for s in body)), None)
            if escape is not None:
                return (
                    f"{escape} inside a block that steps on exit: the block steps when it is left that way, the "
                    "statements would not"
                )
            stepping = next((n for s in body for n in _nodes(s) if (_method_call(n) or ("", ""))[1] == "step"), None)
            if stepping is not None:
                return (
                    f"a `.step(...)` call (line {self.line(stepping)}) inside a block that steps on exit: the block "
                    "refuses a second step (a RuntimeError at its exit), the statements would step twice"
                )
        return _rebinds(body, [opt, recv, *named]) or self.declared_refusal((opt, recv, *named), "inside the block")

    def overridden(self, recv: cst.BaseExpression, flags: dict[str, bool | None]) -> str | None:
        """``with R.toggle_optimizer(X)`` calls an override with the block's flags and uses what it
        returns; the statement calls it with X alone and drops its result. Equal only where no class
        ``R`` may be of overrides it, or (no flags) every override returns its ``super()``'s toggle."""
        classes, _ = self.program.relevant(self.receiver_class(recv))
        own = sorted((c for c in classes if c.toggle is not None), key=lambda c: (c.path, c.line))
        for c in own:
            where = f"`{c.name}.toggle_optimizer` ({c.path}:{c.line})"
            if flags:
                return f"{where} is given the block's flags; the statement would call it with the optimizer alone"
            if c.toggle != "returns":
                return (
                    f"{where} may not return the toggle: the block as written fails there ('NoneType' object does "
                    "not support the context manager protocol), the statements would not"
                )
        return None

    # -- the statements ------------------------------------------------------------------------

    @staticmethod
    def body(stmt: cst.With) -> list[cst.BaseStatement]:
        if isinstance(stmt.body, cst.IndentedBlock):
            return list(stmt.body.body)
        suite = stmt.body  # `with ...: a; b` on one line
        assert isinstance(suite, cst.SimpleStatementSuite)
        return [cst.SimpleStatementLine(body=list(suite.body), trailing_whitespace=suite.trailing_whitespace)]

    def statements(self, stmt: cst.With, read: _Call) -> list[cst.BaseStatement]:
        """``R.toggle_optimizer(X)`` and the ``try``/``finally`` around the body (module docstring).
        The ``with`` line's comments go to the toggle line; the body keeps its own."""
        recv = read.args[0].value if read.through else read.receiver
        opt = read.args[-1].value
        assert recv is not None
        # each flag: the literal True or False, or the expression the block reads (a name)
        flags: dict[str, bool | cst.BaseExpression] = {}
        for a in read.call.args:
            if a.keyword is not None:
                literal = _code(a.value).strip()
                flags[a.keyword.value] = literal == "True" if literal in ("True", "False") else a.value
        item = stmt.items[0]
        block = stmt.body if isinstance(stmt.body, cst.IndentedBlock) else None
        body: list[Any] = [self.walk(s, None) for s in self.body(stmt)]
        zero, step, sync = (flags.get(name, True) for name in _FLAGS)
        if zero is not False or step is not False or item.asname is not None or sync is not True:
            body = [s for s in body if not _bare_pass(s)]  # the try holds more than the body now
        if zero is not False:
            body.insert(0, _when(zero, _method(opt, "zero_grad")))
        if item.asname is not None:
            assert isinstance(item.asname.name, cst.Name)
            bind = cst.Assign(targets=[cst.AssignTarget(item.asname.name)], value=opt)
            body.insert(0 if zero is False else 1, cst.SimpleStatementLine(body=[bind]))
        footer = list(block.footer) if block is not None else []
        if step is not False:  # the body's closing comments stay above the step, at the body's end
            body.append(_when(step, _method(opt, "step"), leading_lines=footer))
            footer = []
        indent = block.indent if block is not None else None
        if sync is not True:  # the block's no-sync context, entered after the toggle, around all of it
            self.needs_contextlib = True
            body = [cst.With(items=[cst.WithItem(_no_sync(recv, sync))], body=cst.IndentedBlock(body=body,
                                                                                                 indent=indent))]
        header = block.header if block is not None else cst.TrailingWhitespace()
        toggle = _statement(_method(recv, _TOGGLE, opt), leading_lines=stmt.leading_lines, trailing_whitespace=header)
        untoggle = cst.IndentedBlock(body=[_statement(_method(recv, _UNTOGGLE, opt))], indent=indent)
        guarded = cst.Try(
            body=cst.IndentedBlock(body=body, indent=indent, footer=footer), finalbody=cst.Finally(body=untoggle)
        )
        return [toggle, guarded]


@dataclass
class _StepInside:
    """A ``X.step(...)`` inside a block over ``X`` that steps on exit (``migrate --check``)."""

    line: int  # of the step call
    block_line: int
    block: str  # the block's call as written
    step: str  # the step call as written
    when: str | None  # the block's step flag where it is not a literal (it steps when that is true)


def steps_inside(module: cst.Module, positions: Any, program: _Program) -> list[_StepInside]:
    """Each ``.step(...)`` on a block's own optimizer (its expression, or the ``as`` name) inside a block
    whose ``step`` flag is not a literal ``False``: the block would step it again on exit (toggleshim
    refuses that at the exit with a ``RuntimeError``). Steps of other optimizers are not the block's."""
    walker = _Unmigrator(module, positions, program)
    found: list[_StepInside] = []
    for node in _nodes(module):
        if not isinstance(node, cst.With) or not node.items:
            continue
        item = node.items[0]
        read = walker.read(item.item)
        if read is None or not read.args:
            continue
        step = next((a.value for a in read.call.args if a.keyword is not None and a.keyword.value == "step"), None)
        if isinstance(step, cst.Name) and step.value == "False":
            continue
        when = None if step is None or (isinstance(step, cst.Name) and step.value == "True") else _code(step).strip()
        opt = read.args[-1].value
        names = [opt] + ([item.asname.name] if item.asname is not None and isinstance(item.asname.name, cst.Name)
                         else [])
        for sub in (n for s in walker.body(node) for n in _nodes(s)):
            m = _method_call(sub)
            if m is not None and m[1] == "step" and any(_same(m[0], n) for n in names):
                found.append(_StepInside(walker.line(sub), walker.line(node), _code(read.call).strip(),
                                         _code(sub).strip(), when))
    return found
