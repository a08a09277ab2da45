"""``toggleshim migrate PATH...``: rewrite statement toggles into blocks, and blocks back into
statements (``--to-lightning``), only where provably equivalent.

A span ``R.toggle_optimizer(X)`` ... ``R.untoggle_optimizer(X)`` in one statement list becomes
``with R.toggle_optimizer(X[, zero_grad=False][, step=False]):`` when the block does exactly what
the statements did on every path without an exception (on an exception the block is safer: it
untoggles). Everything else is left as it is and reported with one reason per span. The rules, and
why each is exact, are in docs/migrate.md. Overrides of ``toggle_optimizer`` are looked for in every
file of the run (two passes: every file's classes are indexed, then each file is rewritten); where
one may return None, the block is ``with toggleshim.toggle(R, X):``, the manual sequence with the
module's own methods. ``--assume NAME`` opts into documented assumptions that let more spans reach
the plain block. ``--to-lightning`` goes the other way: a block becomes ``R.toggle_optimizer(X)``
and ``try: [X.zero_grad()] body [X.step()] finally: R.untoggle_optimizer(X)``, which is what it
does on every path, exceptions included; ``import toggleshim`` goes once nothing needs it.

Modes (as black, ruff and pyupgrade): ``--diff`` (default: a unified diff on stdout, nothing
written), ``--write`` (each file either untouched or fully rewritten: a temporary file in the same
directory, then ``os.replace``), ``--check`` (exit 1 when a statement toggle is not exception-safe,
or an override of toggle_optimizer drops the toggle a block uses; with ``--to-lightning``: while the
code uses toggleshim). Exit codes: 0 fine, 1 findings of ``--check`` or files that could not be
processed (each reported as ``path: skipped: reason``; one file never stops the run), 2 usage, 141
the output pipe closed. Built on LibCST (the ``migrate`` extra), which keeps comments and formatting
outside what it rewrites.

The modules, in the order a run goes through them:

* ``_cli``: the arguments and exit codes (no LibCST: ``--help`` and usage errors need none of it);
* ``_files``: the paths walked into ``.py`` files, the diff, the atomic write;
* ``_command``: the run over the files, in either direction, and what it prints;
* ``_run``: one file read, parsed, indexed (the first pass), then rewritten (the second);
* ``_program``: the classes of the run and their overrides of ``toggle_optimizer``;
* ``_rules`` (forward) and ``_back`` (``--to-lightning``): one file's toggles decided and rewritten,
  on ``_walk`` (the walk both share) and ``_syntax`` (what they read in the tree);
* ``_imports``: where ``import toggleshim`` goes, and when it goes away.

The names that need LibCST (``migrate_source``, ``to_lightning_source`` and the run's types) are
imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toggleshim._migrate._assumptions import ASSUMPTIONS as ASSUMPTIONS
from toggleshim._migrate._cli import _INSTALL_HINT, _has_libcst
from toggleshim._migrate._cli import EXIT_CLOSED_PIPE as EXIT_CLOSED_PIPE
from toggleshim._migrate._cli import _parser as _parser
from toggleshim._migrate._cli import closed_pipe as closed_pipe
from toggleshim._migrate._cli import main as main

if TYPE_CHECKING:
    from toggleshim._migrate._run import _FileResult as _FileResult
    from toggleshim._migrate._run import _Parsed as _Parsed
    from toggleshim._migrate._run import migrate_source as migrate_source
    from toggleshim._migrate._run import to_lightning_source as to_lightning_source

__all__ = ["main"]

# name -> the module of the package that defines it; each needs LibCST
_WITH_LIBCST = {"migrate_source": "_run", "to_lightning_source": "_run", "_FileResult": "_run", "_Parsed": "_run"}


def __getattr__(name: str) -> Any:
    """The names that need LibCST, imported on first use (PEP 562); ImportError with how to get it."""
    module = _WITH_LIBCST.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _has_libcst():
        raise ImportError(f"toggleshim migrate: {_INSTALL_HINT}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
