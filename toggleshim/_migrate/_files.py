"""The files of a run: the paths given walked into ``.py`` files, a diff, an atomic rewrite (no LibCST
here: usage errors are found before it is imported)."""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
import tempfile
from collections.abc import Sequence

_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})


class _UsageError(Exception):
    pass


def _python_files(paths: Sequence[str]) -> list[str]:
    """The .py files named or under the directories named, in order (hidden and cache dirs skipped)."""
    files: list[str] = []
    problems: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(
                    d
                    for d in dirs
                    if not d.startswith(".")
                    and d not in _SKIP_DIRS
                    and not os.path.exists(os.path.join(root, d, "pyvenv.cfg"))
                )
                found += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
            if not found:
                problems.append(f"{path}: no Python files under this directory")
            files += found
        elif not os.path.lexists(path):
            problems.append(f"{path}: no such file or directory")
        elif not path.endswith(".py"):
            problems.append(f"{path}: not a Python file (expected a .py file or a directory)")
        else:
            files.append(path)
    if problems:
        raise _UsageError("\n".join(problems))
    return files


def _diff(path: str, old_bytes: bytes, new_bytes: bytes) -> str:
    """A unified diff of one file, both sides named ``path`` (it applies with ``patch -p0``)."""
    old = old_bytes.decode("utf-8", "replace").splitlines(keepends=True)
    new = new_bytes.decode("utf-8", "replace").splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(old, new, f"{path}", f"{path}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _write_atomically(path: str, data: bytes) -> None:
    """Replace the file's content: a temporary file beside it, then ``os.replace`` (the file is either
    untouched or fully rewritten). The temporary file gets the original's owner, group and permission
    bits before it takes its place; when they cannot be given (a file of another user or group), the
    file is left unchanged and the error says why. A symlink stays a symlink (its target is written)."""
    target = os.path.realpath(path)
    st = os.stat(target)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".toggleshim-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        made = os.stat(tmp)
        if hasattr(os, "chown") and (made.st_uid, made.st_gid) != (st.st_uid, st.st_gid):
            try:  # before chmod: a chown may clear the set-id bits
                os.chown(tmp, st.st_uid, st.st_gid)
            except PermissionError as exc:
                raise PermissionError(
                    exc.errno,
                    f"the file belongs to {st.st_uid}:{st.st_gid} (user:group) and a rewritten copy could not be "
                    f"given them ({exc.strerror}); rewriting it would change its owner",
                ) from exc
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
