"""torch.compile runs toggleshim's code eagerly: every module of the package hands its code to dynamo.

Traced, the toggle's bookkeeping would become dynamo guards that can break compilation; dynamo's
``skip_code`` makes it graph-break at toggleshim's calls instead, as Lightning's newest source does
with ``torch.compiler.disable`` on its own toggle (whose wrapper costs ~3 us a call). Imports torch's
dynamo only once a Lightning flavour is loaded (Lightning has loaded torch by then).
"""

from __future__ import annotations

import sys
from typing import Any

from toggleshim._ours import CORE_MODULES as _CORE_MODULES

__all__ = ["keep_dynamo_out", "mark_for_dynamo"]


# Namespaces whose code is handed to dynamo once a Lightning flavour is loaded (keep_dynamo_out).
_DYNAMO_PENDING: list[dict[str, Any]] = []


def keep_dynamo_out(namespace: dict[str, Any], now: bool = False) -> None:
    """Have torch.compile run the code of ``namespace`` (a module of ours) eagerly instead of tracing
    it, at no cost outside compile.

    While no Lightning flavour is loaded, the namespace waits in ``_DYNAMO_PENDING``: importing torch's
    dynamo costs seconds (``import toggleshim`` before Lightning, the CLI), and no block runs before a
    Lightning is loaded; ``_patch`` hands the waiting ones over (:func:`mark_for_dynamo`) whenever it
    installs, from the import of a flavour on, Lightning having loaded torch by then.
    """
    if not now and not any(name in sys.modules for name in _CORE_MODULES):
        _DYNAMO_PENDING.append(namespace)
        return
    try:
        from torch._dynamo.eval_frame import skip_code
    except Exception:  # pragma: no cover - a torch without dynamo
        return
    file = namespace["__file__"]

    def codes(code: Any) -> Any:
        yield code
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                yield from codes(const)

    for value in list(namespace.values()):
        members = vars(value).values() if isinstance(value, type) else (value,)
        for member in members:
            parts = (member.fget, member.fset, member.fdel) if isinstance(member, property) else (member,)
            for part in parts:
                fn = getattr(part, "__func__", part)
                fn = getattr(fn, "__wrapped__", fn)  # under functools.wraps (a contextmanager): ours
                code = getattr(fn, "__code__", None)
                # by file, not __module__: a wrapper made elsewhere (contextlib's, for one) says ours
                if getattr(code, "co_filename", None) == file:
                    for inner in codes(code):
                        skip_code(inner)


def mark_for_dynamo() -> None:
    """Hand every waiting namespace to dynamo (a Lightning flavour is loaded)."""
    while _DYNAMO_PENDING:
        keep_dynamo_out(_DYNAMO_PENDING.pop(), now=True)




keep_dynamo_out(globals())
