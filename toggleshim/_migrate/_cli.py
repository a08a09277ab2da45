"""The command line of ``toggleshim migrate``: its arguments, its exit codes, and LibCST imported
only once a run needs it (``--help`` and usage errors need none of it; its import takes most of a
second)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from toggleshim._migrate._assumptions import ASSUMPTIONS
from toggleshim._migrate._files import _python_files, _UsageError

# Said after the command's name ("toggleshim migrate: ..."), by main() and on a first use of the package's names
_INSTALL_HINT = 'LibCST is not installed: pip install "toggleshim[migrate]"'


def _has_libcst() -> bool:
    """Import LibCST (the ``migrate`` extra); False when it is not installed."""
    try:
        import libcst  # noqa: F401
    except ImportError:  # the optional extra is not installed: main() says how to get it
        return False
    return True


def _parser(prog: str = "toggleshim") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{prog} migrate",
        description="Rewrite statement toggles (toggle_optimizer ... untoggle_optimizer) into "
        "`with self.toggle_optimizer(opt):` blocks where provably equivalent, or blocks back into Lightning's "
        "statements (--to-lightning) (docs/migrate.md).",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".py files or directories")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--diff", action="store_const", dest="mode", const="diff", help="print a diff (default)")
    mode.add_argument("--write", action="store_const", dest="mode", const="write", help="rewrite the files in place")
    mode.add_argument(
        "--check",
        action="store_const",
        dest="mode",
        const="check",
        help="exit 1 when a statement toggle is not exception-safe, or an override of toggle_optimizer drops the "
        "toggle a block uses (prints file:line and why); with --to-lightning: while the code uses toggleshim",
    )
    parser.add_argument(
        "--assume",
        action="append",
        default=[],
        choices=sorted(ASSUMPTIONS),
        metavar="NAME",
        help="take an opt-in assumption (repeatable; off by default): "
        + "; ".join(f"{name}: {text}" for name, text in ASSUMPTIONS.items()),
    )
    parser.add_argument(
        "--to-lightning",
        action="store_true",
        help="the way back: rewrite toggleshim's blocks into Lightning's own statements (toggle, then the body "
        "in try/finally: untoggle), where exactly equivalent; drop `import toggleshim` once nothing needs it",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say in full what the run assumed and why (by default one short line)",
    )
    parser.set_defaults(mode="diff")
    return parser


# Exit status when the reader of our output went away (``| head``): what a shell reports for a
# process killed by SIGPIPE (128 + 13), as `cat` or `git diff` would be.
EXIT_CLOSED_PIPE = 141


def main(argv: list[str], prog: str = "toggleshim") -> int:
    """``toggleshim migrate``; returns the exit code. ``prog``: how the program was called (usage lines)."""
    parser = _parser(prog)
    try:
        args = parser.parse_args(argv)
        if args.to_lightning and args.assume:
            parser.error("--assume is for statement toggles into blocks; --to-lightning takes no assumption")
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    if not _has_libcst():
        sys.stderr.write(f"toggleshim migrate: {_INSTALL_HINT}\n")
        return 2
    try:
        files = _python_files(args.paths)
    except _UsageError as exc:
        sys.stderr.write(f"toggleshim migrate: {exc}\nnothing was changed\n")
        return 2
    # LibCST's import, once it is known to be there
    from toggleshim._migrate._command import _migrate_files, _unmigrate_files

    try:
        if args.to_lightning:
            code = _unmigrate_files(files, args.mode, args.verbose)
        else:
            code = _migrate_files(files, args.mode, frozenset(args.assume), args.verbose)
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        return closed_pipe()
    return code


def closed_pipe() -> int:
    """The reader of our output went away (``| head``): stop quietly, with :data:`EXIT_CLOSED_PIPE`.
    Python would flush the buffered rest at exit and print a traceback about it; the standard streams
    go to devnull instead. (``check`` uses it too.)"""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    return EXIT_CLOSED_PIPE
