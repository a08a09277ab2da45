"""Running a command on a terminal, as users see it: a pseudo-terminal for stdin, stdout and stderr."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path


def run_on_pty(args: list[str], timeout: float = 300, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``args`` with stdin/stdout/stderr on a pseudo-terminal; (exit status, everything it wrote)."""
    master, slave = os.openpty()
    env = env if env is not None else dict(os.environ)
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True, cwd=cwd)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return rc, b"".join(chunks).decode(errors="replace")
