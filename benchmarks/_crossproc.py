"""Timing two variants of a workload in separate fresh interpreters, alternating: the shared part of
``benchmarks/block_vs_manual.py`` and ``benchmarks/footprint.py``.

Each run of a variant is a fresh ``python`` process (this repository's interpreter) that builds the
workload, warms it up, then times batches of it on the process's CPU clock (the cyclic collector off
while a batch runs, as ``timeit`` does) and prints the median per-iteration time. Variants A and B
alternate A B B A ... so that neither always runs first or on a warmer machine; a ratio is the median of
the per-pair ratios, with their range. One variant's process never imports what the other tests:
the anchor of a comparison runs in a process without toggleshim.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))


def time_per_iteration(run: Callable[[int], None], seconds: float, warmup: int = 3) -> float:
    """Median seconds per iteration of ``run(n)`` over batches of about 20 ms, for ``seconds`` CPU s."""
    run(warmup)
    n = 1
    while True:  # calibrate: a batch of about 20 ms
        took = _batch(run, n)
        if took >= 0.02 or n >= 1 << 24:
            break
        n *= 2
    samples: list[float] = []
    end = time.process_time() + seconds
    while time.process_time() < end or len(samples) < 5:
        samples.append(_batch(run, n) / n)
    return statistics.median(samples)


def _batch(run: Callable[[int], None], n: int) -> float:
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.process_time_ns()
        run(n)
        return (time.process_time_ns() - start) / 1e9
    finally:
        if enabled:
            gc.enable()


Workload = Callable[[str, dict[str, str]], Callable[[int], None]]  # (variant, options) -> run(n)


def child_main(argv: Sequence[str], workloads: dict[str, Workload]) -> None:
    """``--child VARIANT WORKLOAD key=value...``: build the workload for the variant, print its time."""
    variant, workload, *pairs = argv
    options = dict(p.split("=", 1) for p in pairs)
    seconds = float(options.pop("seconds", "1.0"))
    import torch

    torch.set_num_threads(1)
    run = workloads[workload](variant, options)
    per = time_per_iteration(run, seconds)
    print(json.dumps({"seconds_per_iteration": per, "toggleshim_imported": "toggleshim" in sys.modules}))


@dataclass
class Result:
    a_us: float
    b_us: float
    ratios: list[float]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def cell(self) -> str:
        return f"**{self.ratio:.3f}** ({min(self.ratios):.3f}-{max(self.ratios):.3f})"


def compare(script: str, workload: str, a: str, b: str, options: dict[str, str], runs: int) -> Result:
    """``runs`` pairs of fresh processes of ``script --child a|b workload``, alternating; the ratio is A/B."""
    times: dict[str, list[float]] = {a: [], b: []}
    ratios: list[float] = []
    for k in range(runs):
        order = (a, b) if k % 2 == 0 else (b, a)
        got = {v: _child(script, v, workload, options) for v in order}
        for v in (a, b):
            times[v].append(got[v])
        ratios.append(got[a] / got[b])
    return Result(statistics.median(times[a]) * 1e6, statistics.median(times[b]) * 1e6, ratios)


def _child(script: str, variant: str, workload: str, options: dict[str, str]) -> float:
    args = [sys.executable, script, "--child", variant, workload, *(f"{k}={v}" for k, v in options.items())]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return float(out["seconds_per_iteration"])


def header(command: str) -> str:
    import platform

    import torch

    try:
        from importlib.metadata import version

        lightning = version("lightning")
    except Exception:  # a label only
        lightning = "?"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout
    return (f"`{command}`, commit {commit.strip() or '?'}, Python {platform.python_version()}, torch "
            f"{torch.__version__}, lightning {lightning}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
