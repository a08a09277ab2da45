"""Start-up: how long toggleshim's commands take to answer, and what ``import toggleshim`` imports.

    python benchmarks/startup.py              # the markdown tables of docs/performance.md, "Start-up"
    python benchmarks/startup.py --runs 9

Each command runs ``--runs`` times in a fresh process (wall clock, the median); then once under
``python -X importtime`` for the cumulative import time of toggleshim, torch and ``torch._dynamo``
("not imported": not at all).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
SCRIPT = str(Path(PY).with_name("toggleshim"))
MODULES = ("toggleshim", "torch", "torch._dynamo", "lightning.pytorch")


def commands(tmp: str) -> list[tuple[str, list[str]]]:
    source = Path(tmp) / "train.py"
    source.write_text(
        "def training_step(self, opt):\n    self.toggle_optimizer(opt)\n    self.untoggle_optimizer(opt)\n"
    )
    return [
        ("toggleshim --help", [SCRIPT, "--help"]),
        ("toggleshim check --help", [SCRIPT, "check", "--help"]),
        ("toggleshim check --examples 0 (usage error)", [SCRIPT, "check", "--examples", "0"]),
        ("toggleshim migrate --help", [SCRIPT, "migrate", "--help"]),
        ("toggleshim migrate train.py (a diff)", [SCRIPT, "migrate", str(source)]),
        ("python -c 'import toggleshim'", [PY, "-c", "import toggleshim"]),
        ("python -c 'import lightning.pytorch'", [PY, "-c", "import lightning.pytorch"]),
        ("python -c 'import lightning.pytorch, toggleshim'", [PY, "-c", "import lightning.pytorch, toggleshim"]),
    ]


def wall(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def imported(cmd: list[str]) -> dict[str, float]:
    """Cumulative import time in seconds of each of MODULES the command imported."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    err = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False).stderr
    found = {}
    for m in re.finditer(r"import time:\s+\d+ \|\s+(\d+) \|\s*(\S+)$", err, re.MULTILINE):
        if m.group(2) in MODULES:  # a package its parent imports appears twice: the outer line holds all
            found[m.group(2)] = max(found.get(m.group(2), 0.0), int(m.group(1)) / 1e6)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"`python benchmarks/startup.py --runs {args.runs}`, commit {rev}, {os.cpu_count()} cores\n")
    print("| command | wall time (median) | " + " | ".join(f"`{m}` imported in" for m in MODULES) + " |")
    print("|:---|---:|" + "---:|" * len(MODULES))
    with tempfile.TemporaryDirectory() as tmp:
        for label, cmd in commands(tmp):
            seconds = wall(cmd, args.runs)
            found = imported(cmd)
            cells = " | ".join(f"{found[m]:.2f} s" if m in found else "not imported" for m in MODULES)
            print(f"| `{label}` | {seconds:.2f} s | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
