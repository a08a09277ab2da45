"""torch.compile runs toggleshim's code eagerly: its entry points are ``torch.compiler.disable``d.

A block inside a compiled function (``with self.toggle_optimizer(opt):`` in a function under
``torch.compile``) would otherwise be traced: the toggle's bookkeeping would become dynamo guards (or
an internal error of dynamo's, over the module state it reads), and the optimizer's ``zero_grad`` and
``step`` inside it would be compiled. Disabled, dynamo breaks the graph at each entry point and runs
it, and everything it calls, eagerly, as Lightning's newest source does with its own toggle. It costs
a wrapper call (about 0.3 us) at each of the three entry points of a block.

The patched methods are disabled as they are installed (``_patch``); the block's own entry points
here, by ``install()`` once a Lightning flavour is loaded (torch is loaded by then: ``import
toggleshim`` alone imports no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["disabled", "keep_dynamo_out"]


def disabled(fn: Callable[..., Any], like: Any = None) -> Callable[..., Any]:
    """``torch.compiler.disable(fn)``, keeping the options of ``like`` (Lightning's own marked method)."""
    import torch

    wrapped: Callable[..., Any] = torch.compiler.disable(  # type: ignore[no-untyped-call]
        fn,
        recursive=getattr(like, "_torchdynamo_disable_recursive", True),
        reason=getattr(like, "_torchdynamo_disable_msg", None),
    )
    return wrapped


def keep_dynamo_out() -> None:
    """The block's ``__enter__`` and ``__exit__`` run eagerly under torch.compile. Idempotent."""
    from toggleshim._block import Toggle

    for name in ("__enter__", "_exit"):
        fn = vars(Toggle)[name]
        if not getattr(fn, "_torchdynamo_disable", False):
            setattr(Toggle, name, disabled(fn))
