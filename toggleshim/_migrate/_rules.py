"""The forward rewrite of one file: each statement toggle ``R.toggle_optimizer(X)`` ...
``R.untoggle_optimizer(X)`` decided by the rules of docs/migrate.md (in the same order as there) and,
where they hold, rebuilt as ``with R.toggle_optimizer(X[, zero_grad=False][, step=False]):``, or as
``with toggleshim.toggle(R, X, ...):`` where an override in the run may return None."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst

from toggleshim._migrate._program import _LIGHTNING_BASES, _Class, _Program
from toggleshim._migrate._syntax import (
    _TOGGLE,
    _TOGGLE_FAMILY,
    _UNTOGGLE,
    _code,
    _escape,
    _method_call,
    _nodes,
    _only_expr,
    _plain_method_line,
    _prefixes,
    _rebinds,
    _ref,
    _same,
    _shadows_toggleshim,
    _single_arg,
    _steps,
    _toggle_line,
    _toggling,
)
from toggleshim._migrate._walk import _Walker


@dataclass
class _Span:
    """What the analysis found for one statement toggle."""

    line: int
    text: str  # the toggle as written, e.g. ``self.toggle_optimizer(d_opt)``
    untoggle_line: int | None = None
    reason: str | None = None  # why it is not migrated (None: migrated)
    safe: bool = False  # already exception-safe (an untoggle in the ``finally`` right after it)


def _zero_grad_line(stmt: cst.CSTNode, obj_key: str, torch2: bool) -> bool:
    """A line that is exactly ``X.zero_grad()``; with the ``torch2-defaults`` assumption also
    ``X.zero_grad(set_to_none=True)`` (torch >= 2.0's default: the block's ``X.zero_grad()``)."""
    if _plain_method_line(stmt, "zero_grad", obj_key):
        return True
    expr = _only_expr(stmt)
    found = _method_call(expr) if expr is not None else None
    if not torch2 or found is None or found[1] != "zero_grad" or _ref(found[0]) != obj_key:
        return False
    args = found[2].args
    return (
        len(args) == 1
        and args[0].keyword is not None
        and args[0].keyword.value == "set_to_none"
        and isinstance(args[0].value, cst.Name)
        and args[0].value.value == "True"
    )


# Names through which a line visibly touches gradients: the ``forward-reads-no-grad`` assumption never
# moves ``zero_grad()`` across a line naming one of them (it covers only what the tool cannot see).
_GRADIENT_NAMES = frozenset(
    {
        "grad",
        "backward",
        "manual_backward",
        "step",
        "zero_grad",
        "clip_gradients",
        "clip_grad_norm_",
        "clip_grad_value_",
        "autograd",
        "_grad",
    }
    | _TOGGLE_FAMILY
)


def _touches_gradients(stmt: cst.CSTNode) -> bool:
    """The line names a gradient, a backward, a step, a zero_grad, a clipping or a toggle."""
    return any(isinstance(n, cst.Name) and n.value in _GRADIENT_NAMES for n in _nodes(stmt))


def _arguments_refusal(call: cst.Call) -> str:
    """Why ``toggle_optimizer(...)`` is not Lightning 2's statement toggle ``toggle_optimizer(optimizer)``."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    if len(positional) == 2 and len(call.args) == 2:
        return (
            "`toggle_optimizer(optimizer, optimizer_idx)` is Lightning 1.x's form (its untoggle_optimizer takes the "
            "index); the block needs Lightning >= 2.0, where toggle_optimizer takes the optimizer alone"
        )
    if keywords & {"zero_grad", "step"}:
        return "toggle_optimizer is already given zero_grad=/step= (toggleshim's call, not Lightning's statement form)"
    if not call.args:
        return "toggle_optimizer is given no optimizer"
    return "toggle_optimizer is given more than the optimizer (or it by keyword, or *args): not Lightning's form"


# Names that are constants of the language (keywords), not variables: reading them cannot fail.
_CONSTANT_NAMES = frozenset({"None", "True", "False"})


def _literal(e: cst.BaseExpression) -> bool:
    """An expression whose evaluation runs no user code, reads no variable and cannot raise: a number
    (signed or not), a string or bytes without an f-string part (implicit concatenation included),
    ``...``, ``None``/``True``/``False``, and tuple or list displays of these. An allow-list: any
    other form (an f-string anywhere, a name, an attribute, a subscript, an operator, a comparison,
    a call) may run user code (``__format__``, a property, ``__getitem__``, ``__eq__``...) or fail."""
    if isinstance(e, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis)):
        return True
    if isinstance(e, cst.ConcatenatedString):  # `"a: " f"{x}"` is a ConcatenatedString too
        return _literal(e.left) and _literal(e.right)
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, (cst.Minus, cst.Plus)):
        return isinstance(e.expression, (cst.Integer, cst.Float, cst.Imaginary))
    if isinstance(e, cst.Name):
        return e.value in _CONSTANT_NAMES
    if isinstance(e, (cst.Tuple, cst.List)):
        return all(isinstance(el, cst.Element) and _literal(el.value) for el in e.elements)
    return False


def _inert_store(target: cst.BaseExpression, value: cst.BaseExpression, protected: set[str]) -> bool:
    """Binding ``value`` (a literal) to ``target`` runs no user code and cannot raise: a plain name
    (not one the toggle's expressions start from), or a tuple/list of such targets unpacking a
    display of exactly as many elements (unpacking anything else calls its ``__iter__``)."""
    if isinstance(target, cst.Name):
        return target.value not in protected
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) != len(value.elements):
            return False
        return all(
            isinstance(t, cst.Element) and isinstance(v, cst.Element) and _inert_store(t.value, v.value, protected)
            for t, v in zip(target.elements, value.elements)
        )
    return False


def _inert(stmt: cst.CSTNode, protected: set[str], bindings: bool = True) -> bool:
    """A line that can run no user code, read no state and raise nothing, so ``zero_grad()`` and
    ``step()`` may move across it: ``pass``, a literal, or (``bindings``: in a function body, where a
    name is a local no ``step()`` can read) literals bound to plain names (see ``_literal``,
    ``_inert_store``; ``protected``: names the toggle's expressions start from). At module or class
    level a name is a global or class attribute that an optimizer's ``step`` may read, and the store
    goes through a mapping (a class's ``__prepare__``, ``exec``'s locals) that may run user code."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Pass):
            continue
        if isinstance(small, cst.Expr) and _literal(small.value):
            continue
        if (
            bindings
            and isinstance(small, cst.Assign)
            and _literal(small.value)
            and all(_inert_store(t.target, small.value, protected) for t in small.targets)
        ):
            continue
        return False
    return True


class _Migrator(_Walker):
    """Walks one module: finds statement toggles, decides each span, rebuilds the changed lists."""

    def __init__(
        self, module: cst.Module, positions: Any, program: _Program, assume: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(module, positions, program)
        self.assume = assume
        self.spans: list[_Span] = []
        self.other: list[tuple[int, str]] = []
        self.migrated = 0
        self.plain = 0  # blocks written `with R.toggle_optimizer(X)` (they rely on the assumption)
        self.through = 0  # blocks written `with toggleshim.toggle(R, X)` (they need `import toggleshim`)
        self.outside: set[str] = set()  # bases from outside the run the plain blocks' classes have
        self.blocks: list[tuple[int, _Class]] = []  # `with self.toggle_optimizer(...)` found: (line, class)
        self.shadowed = _shadows_toggleshim(module)

    def visit(self, node: cst.CSTNode, outer: str | None) -> str | None:
        if isinstance(node, cst.With):
            for item in node.items:
                found = _method_call(item.item)
                cls = self.receiver_class(found[0]) if found is not None and found[1] == _TOGGLE else None
                if cls is not None:  # `with self.toggle_optimizer(...)` in a method of cls (--check)
                    self.blocks.append((self.line(node), cls))
        if isinstance(node, cst.SimpleStatementSuite | cst.SimpleStatementLine):
            self.note_statements(node, outer)
        return super().visit(node, outer)

    def form(self, recv: cst.BaseExpression, flags: bool) -> tuple[bool, set[str]]:
        """(True: ``with R.toggle_optimizer(X)`` is the manual sequence; False: only ``with
        toggleshim.toggle(R, X)`` is), and the bases from outside the run the receiver's classes have.
        A ``with`` needs toggle_optimizer to return the toggle: every override among the classes the
        receiver may be of must be ``return super().toggle_optimizer(opt)``, forwarding ``**kwargs``
        when the block passes flags. ``toggleshim.toggle`` calls the module's own toggle_optimizer with
        the optimizer alone and runs the rest of the sequence around it, whatever the override returns."""
        classes, outside = self.program.relevant(self.receiver_class(recv))
        own = [c for c in classes if c.toggle is not None]
        return all(c.toggle == "returns" and (c.forwards or not flags) for c in own), outside - _LIGHTNING_BASES

    def note_statements(self, node: cst.SimpleStatementLine | cst.SimpleStatementSuite, outer: str | None) -> None:
        """Toggles that are not a line of their own, and uses of a toggle's result: reported."""
        for small in node.body:
            for sub in _nodes(small):
                found = _method_call(sub)
                if found is None or found[1] != _TOGGLE or self.delegates(sub):
                    continue
                if isinstance(small, cst.Expr) and small.value is sub:
                    if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1:
                        continue  # a statement toggle: statement_list() decides it
                    suite = isinstance(node, cst.SimpleStatementSuite)
                    where = "its if/for/while header" if suite else "other statements"
                    self.spans.append(_Span(self.line(sub), _code(sub), reason=f"it shares its line with {where}"))
                else:
                    self.other.append((self.line(sub), "the result of toggle_optimizer is used (not a statement)"))

    def statement_list(self, node: cst.Module | cst.IndentedBlock, outer: str | None) -> cst.CSTNode:
        body = list(node.body)
        decided: dict[int, tuple[int, _Span]] = {}  # toggle index -> (untoggle index, span) when migrated
        open_at: list[str | None] = [outer] * len(body)  # what is open around each statement
        for i, stmt in enumerate(body):
            found = _toggle_line(stmt, _TOGGLE)
            if found is None or self.delegates(found[1]):
                continue
            span = _Span(self.line(stmt), _code(found[1]).strip())
            self.spans.append(span)
            end = self.decide(body, i, found, open_at[i], span)
            if span.reason is None:
                assert end is not None
                decided[i] = (end, span)
            stop = i + 2 if span.safe else end if end is not None else len(body)
            for k in range(i + 1, stop):
                open_at[k] = open_at[k] or f"inside the span of the statement toggle at line {span.line}"
        new_body = [self.walk(stmt, open_at[k]) for k, stmt in enumerate(body)]
        if not decided:
            if all(a is b for a, b in zip(new_body, body)):
                return node
            return node.with_changes(body=new_body)
        out: list[Any] = []
        # The untoggle's comments (above it, or on its line) go after the block, at the untoggle's
        # indentation: they were on that side of the body; inside the block they would describe it.
        after: list[cst.EmptyLine] = []
        k = 0
        while k < len(body):
            item: Any = new_body[k]
            nxt, comments = k + 1, []
            if k in decided:
                end, _span = decided[k]
                item = self.block(body, new_body, k, end)
                self.migrated += 1
                nxt, comments = end + 1, list(self.comments(body[end]))
            if after:
                item = item.with_changes(leading_lines=[*after, *item.leading_lines])
            out.append(item)
            after, k = comments, nxt
        if after:
            return node.with_changes(body=out, footer=[*after, *node.footer])
        return node.with_changes(body=out)

    def decide(
        self,
        body: Sequence[cst.CSTNode],
        i: int,
        found: tuple[cst.BaseExpression, cst.Call],
        outer: str | None,
        span: _Span,
    ) -> int | None:
        """Decide the span that starts at ``body[i]`` (``span.reason`` stays None when it is migrated);
        return the index of the first untoggle after it in this list (None when there is none)."""
        end = next((k for k in range(i + 1, len(body)) if _toggle_line(body[k], _UNTOGGLE) is not None), None)
        if end is not None:
            span.untoggle_line = self.line(body[end])
        span.reason = self.refusal(body, i, end, found, outer, span)
        return end

    def refusal(
        self,
        body: Sequence[cst.CSTNode],
        i: int,
        end: int | None,
        found: tuple[cst.BaseExpression, cst.Call],
        outer: str | None,
        span: _Span,
    ) -> str | None:
        """Why the span ``body[i] .. body[end]`` cannot become a block (None: it can), rules in order."""
        recv, call = found
        opt = _single_arg(call)
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, cst.Try) and nxt.finalbody is not None and opt is not None:
            for s in nxt.finalbody.body.body:
                u = _toggle_line(s, _UNTOGGLE)
                if u is not None and _same(u[0], recv) and _same(_single_arg(u[1]), opt):
                    span.safe = True
                    return "already exception-safe (untoggled in the finally right after it)"
        if opt is None:
            return _arguments_refusal(call)
        if outer is not None:
            return f"it is {outer}: blocks nest differently from statement toggles"
        inside = body[i + 1 : len(body) if end is None else end]
        for stmt in inside:
            if _toggle_line(stmt, _TOGGLE) is not None:
                return (
                    f"another statement toggle (line {self.line(stmt)}) opens before its untoggle: overlapping "
                    "statement toggles nest Lightning's way, blocks nest differently"
                )
            for sub in _nodes(stmt):
                m = _method_call(sub)
                if m is not None and _toggling(m):
                    if m[1] == _UNTOGGLE:
                        return f"a conditional untoggle (line {self.line(sub)}, inside a compound statement)"
                    return f"a {m[1]} call (line {self.line(sub)}) between the toggle and the untoggle would nest"
        if end is None:
            return "no untoggle_optimizer follows it in the same block"
        untoggle = _toggle_line(body[end], _UNTOGGLE)
        assert untoggle is not None
        if not _same(_single_arg(untoggle[1]), opt):
            return f"the untoggle_optimizer at line {span.untoggle_line} is not given the same optimizer expression"
        if not _same(untoggle[0], recv):
            return f"the untoggle_optimizer at line {span.untoggle_line} is called on another object"
        if self.shadowed is not None and not self.form(recv, True)[0]:
            return (
                "an override of toggle_optimizer that may return None needs `with toggleshim.toggle(...)`, and "
                f"{self.shadowed}"
            )
        for expr in (opt, recv):
            if _ref(expr) is None:
                return (
                    f"`{_code(expr).strip()}` may not be the same object at the untoggle (allowed: a name, an "
                    "attribute chain on a name, a subscript by an int literal)"
                )
        escape = next(filter(None, (_escape(s) for s in inside)), None)
        if escape is not None:
            return f"{escape} between the toggle and the untoggle (a block would step and untoggle there)"
        rebound = _rebinds(inside, [opt, recv])
        if rebound is not None:
            return rebound
        return self.declared_refusal((opt, recv), "between the toggle and the untoggle")

    def block(self, body: Sequence[cst.CSTNode], new_body: Sequence[cst.CSTNode], i: int, end: int) -> cst.With:
        """The ``with`` statement for the migrated span ``body[i] .. body[end]``."""
        toggle_line = body[i]
        found = _toggle_line(toggle_line, _TOGGLE)
        assert found is not None and isinstance(toggle_line, cst.SimpleStatementLine)
        recv, call = found
        opt = _single_arg(call)
        assert opt is not None
        key = _ref(opt)
        assert key is not None
        protected = {k.split(".")[0].split("[")[0] for k in _prefixes(opt) | _prefixes(recv)}
        bindings = bool(self.scopes) and isinstance(self.scopes[-1], cst.FunctionDef)
        inside = list(range(i + 1, end))
        carried_front: list[cst.EmptyLine] = []
        carried_back: list[cst.EmptyLine] = []  # the step's comments (the untoggle's go after the block)
        # zero_grad: the block's entry calls it right after the toggle; a first `X.zero_grad()` may
        # move there when only inert lines stand before it.
        zero_grad = False
        forward = "forward-reads-no-grad" in self.assume
        for pos, k in enumerate(inside):
            if _zero_grad_line(body[k], key, "torch2-defaults" in self.assume):
                if all(
                    _inert(body[j], protected, bindings) or (forward and not _touches_gradients(body[j]))
                    for j in inside[:pos]
                ):
                    zero_grad = True
                    carried_front = list(self.comments(body[k]))
                    inside.remove(k)
                break
        # step: the block's clean exit calls it right before the untoggle; the last `X.step()` may
        # move there when only inert lines follow it.
        step = False
        for pos in range(len(inside) - 1, -1, -1):
            k = inside[pos]
            if _plain_method_line(body[k], "step", key):
                # ... and no other line may step X (the block refuses a step inside a stepping block)
                if all(_inert(body[j], protected, bindings) for j in inside[pos + 1 :]) and not any(
                    _steps(body[j]) for j in inside if j != k
                ):
                    step = True
                    carried_back = list(self.comments(body[k])) + carried_back
                    inside.remove(k)
                break
        stmts: list[Any] = [new_body[k] for k in inside] or [cst.SimpleStatementLine([cst.Pass()])]
        if carried_front:
            first = stmts[0]
            stmts[0] = first.with_changes(leading_lines=[*carried_front, *first.leading_lines])
        flags = [name for name, on in (("zero_grad", zero_grad), ("step", step)) if not on]
        plain, outside = self.form(recv, bool(flags))
        space = cst.SimpleWhitespace(" ")
        if plain:
            self.plain += 1
            self.outside |= outside
        if flags:
            args = [call.args[0].with_changes(comma=cst.Comma(whitespace_after=space))]
            for n, name in enumerate(flags):
                args.append(
                    cst.Arg(
                        value=cst.Name("False"),
                        keyword=cst.Name(name),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                        comma=cst.Comma(whitespace_after=space) if n < len(flags) - 1 else cst.MaybeSentinel.DEFAULT,
                    )
                )
            call = call.with_changes(args=args)
        if not plain:  # `toggleshim.toggle(R, X, ...)`: the module's own toggle_optimizer, whatever it returns
            self.through += 1
            func = cst.Attribute(value=cst.Name("toggleshim"), attr=cst.Name("toggle"))
            receiver = cst.Arg(recv, comma=cst.Comma(whitespace_after=space))
            call = call.with_changes(func=func, args=[receiver, *call.args])
        return cst.With(
            items=[cst.WithItem(call)],
            body=cst.IndentedBlock(body=stmts, header=toggle_line.trailing_whitespace, footer=carried_back),
            leading_lines=toggle_line.leading_lines,
        )

    @staticmethod
    def comments(stmt: cst.CSTNode) -> Iterator[cst.EmptyLine]:
        """The comments of a line that goes away (kept, as comment lines, where it was)."""
        assert isinstance(stmt, cst.SimpleStatementLine)
        for line in stmt.leading_lines:
            if line.comment is not None:
                yield line
        if stmt.trailing_whitespace.comment is not None:
            yield cst.EmptyLine(comment=stmt.trailing_whitespace.comment)
