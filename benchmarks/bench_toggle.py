#!/usr/bin/env python
"""What a block keeps, and how the harness runs: memory, weak references, long-lived processes.

Run from the repository root::

    python benchmarks/bench_toggle.py                  # the default sections: memory, weakref
    python benchmarks/bench_toggle.py --only longlived # 10,000 LightningOptimizer wrappers, 100 head replacements
    python benchmarks/bench_toggle.py --only harness   # the harness's speed (worlds a second)
    python benchmarks/bench_toggle.py --only profile   # cProfile of the block
    python benchmarks/bench_toggle.py --list           # the sections

The block's speed against what a user runs instead is ``benchmarks/block_vs_manual.py`` (each variant
in a process of its own: the anchor in a process without toggleshim); what ``import toggleshim`` costs
code that never enters a block is ``benchmarks/footprint.py``. Nothing here compares speeds.

The fixture: ``Parameter`` objects, each a ``torch.zeros(4)``, in an ``nn.ParameterList``, split into
contiguous chunks, one plain ``torch.optim.SGD`` per chunk, on a trainer stand-in exposing
``optimizers``. Sections (``--only NAME[,NAME]``; the default runs every section marked default): a
section is a function registered with ``@section``; it takes the parsed arguments, returns its
Markdown, and puts its numbers into the JSON report under its own name.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import platform
import pstats
import statistics
import sys
import time
import tracemalloc
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import toggleshim
from toggleshim import _toggle

try:
    from lightning.pytorch import LightningModule

    _FLAVOUR = "lightning.pytorch"
except ImportError:  # pragma: no cover - only the standalone package installed
    from pytorch_lightning import LightningModule

    _FLAVOUR = "pytorch_lightning"

ORIGINAL_TOGGLE: Any = getattr(vars(LightningModule)["toggle_optimizer"], "_toggleshim_original", None)
ORIGINAL_UNTOGGLE: Any = getattr(vars(LightningModule)["untoggle_optimizer"], "_toggleshim_original", None)
if ORIGINAL_TOGGLE is None or ORIGINAL_UNTOGGLE is None:
    sys.exit(f"toggleshim is not installed on {_FLAVOUR}.LightningModule; nothing to compare")
HAS_TOGGLED = "toggled_optimizer" in vars(LightningModule)  # lightning >= 2.5.1

LR = 1e-6
TARGET_AT_LARGE = 0.6  # block/manual at >= 1,000 parameters, body none (issue: pure Python)
TARGET_EVERYWHERE = 1.0
TARGET_AT_TEN = 1.05


# -- sections -------------------------------------------------------------------------------

@dataclass
class Section:
    name: str
    run: Callable[[argparse.Namespace, dict[str, Any]], str]
    default: bool
    help: str


SECTIONS: dict[str, Section] = {}


def section(name: str, *, default: bool = True) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register ``fn(args, report) -> markdown`` as a section selectable with ``--only name``."""

    def register(fn: Callable[..., str]) -> Callable[..., str]:
        SECTIONS[name] = Section(name, fn, default, (fn.__doc__ or "").strip().splitlines()[0])
        return fn

    return register


# -- fixture ----------------------------------------------------------------------------------

class BenchModule(LightningModule):
    """``n`` small parameters in an ``nn.ParameterList``; nothing else."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.params = nn.ParameterList([nn.Parameter(torch.zeros(4)) for _ in range(n)])


def _lightning_twin() -> type[BenchModule]:
    """A subclass on which toggle/untoggle are Lightning's originals (so is its toggled_optimizer)."""

    class LightningOwn(BenchModule):
        toggle_optimizer = ORIGINAL_TOGGLE
        untoggle_optimizer = ORIGINAL_UNTOGGLE

    return LightningOwn


class TrainerStandIn:
    """All that toggling reads from a Trainer: ``.optimizers``.

    ``LightningModule.trainer`` is a property returning ``self._trainer`` (when no Fabric is attached
    and it is not None); the ``trainer`` setter stores the stand-in there.
    """

    __slots__ = ("optimizers",)

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers


@dataclass
class Fixture:
    n_params: int
    n_opts: int
    body_kind: str
    module: BenchModule
    twin: BenchModule
    opts: list[torch.optim.SGD]
    groups: list[list[nn.Parameter]]
    bodies: list[Callable[[], None]]
    variants: dict[str, Callable[[int], None]] = field(default_factory=dict)


def _make_body(params: list[nn.Parameter], kind: str) -> Callable[[], None]:
    if kind == "none":
        def empty_body() -> None:
            pass
        return empty_body
    grad = torch.full((4,), 1e-3)  # shared and never written: SGD without momentum only reads it

    def body() -> None:
        for p in params:
            p.grad = grad

    return body


def make_fixture(n_params: int, n_opts: int, body_kind: str) -> Fixture:
    module = BenchModule(n_params)
    params = list(module.params)
    groups = [params[i * n_params // n_opts:(i + 1) * n_params // n_opts] for i in range(n_opts)]
    opts = [torch.optim.SGD(g, lr=LR, momentum=0.0) for g in groups]
    trainer = TrainerStandIn(opts)
    module.trainer = trainer
    assert module.trainer is trainer
    twin = _lightning_twin()(0)
    twin.params = module.params  # the very same Parameter objects
    twin.trainer = trainer
    bodies = [_make_body(g, body_kind) for g in groups]
    fx = Fixture(n_params, n_opts, body_kind, module, twin, opts, groups, bodies)
    fx.variants = _variants(fx)
    return fx


def _variants(fx: Fixture) -> dict[str, Callable[[int], None]]:
    """Each variant runs ``n`` iterations; an iteration toggles every optimizer once."""
    module, twin = fx.module, fx.twin
    pairs = list(zip(fx.opts, fx.bodies, strict=True))
    toggle, untoggle = ORIGINAL_TOGGLE, ORIGINAL_UNTOGGLE

    def block(n: int) -> None:
        for _ in range(n):
            for opt, body in pairs:
                with module.toggle_optimizer(opt):
                    body()

    def manual(n: int) -> None:
        for _ in range(n):
            for opt, body in pairs:
                toggle(module, opt)
                opt.zero_grad()
                body()
                opt.step()
                untoggle(module, opt)

    def toggled(n: int) -> None:
        for _ in range(n):
            for opt, body in pairs:
                with twin.toggled_optimizer(opt):
                    opt.zero_grad()
                    body()
                    opt.step()

    def statement(n: int) -> None:
        for _ in range(n):
            for opt, _body in pairs:
                module.toggle_optimizer(opt)
                module.untoggle_optimizer(opt)

    def original(n: int) -> None:
        for _ in range(n):
            for opt, _body in pairs:
                toggle(module, opt)
                untoggle(module, opt)

    found: dict[str, Callable[[int], None]] = {
        "block": block, "manual": manual, "toggled": toggled, "statement": statement, "original": original,
    }
    if not HAS_TOGGLED:
        del found["toggled"]
    return found


# -- timing -----------------------------------------------------------------------------------

CLOCKS = {"cpu": time.process_time_ns, "wall": time.perf_counter_ns}
_clock = CLOCKS["cpu"]


def _time_batch(run: Callable[[int], None], n: int, keep_gc: bool) -> float:
    enabled = gc.isenabled()
    if not keep_gc:
        gc.disable()
    try:
        clock = _clock
        t0 = clock()
        run(n)
        return (clock() - t0) / 1e9
    finally:
        if enabled:
            gc.enable()


def _calibrate(run: Callable[[int], None], batch_s: float, keep_gc: bool) -> int:
    n = 1
    while True:
        t = _time_batch(run, n, keep_gc)
        if t >= batch_s / 4 or n >= 1 << 20:
            return max(1, round(n * batch_s / max(t, 1e-9)))
        n *= 4


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 4:
        return min(xs), max(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


@section("memory")
def run_memory(args: argparse.Namespace, report: dict[str, Any]) -> str:
    """tracemalloc growth over many blocks (and statement toggles) after a warm-up."""
    n_opts = 2
    fx = make_fixture(args.mem_params, n_opts, "none")
    module, pairs = fx.module, list(zip(fx.opts, fx.bodies, strict=True))

    def bare_block(n: int) -> None:
        for _ in range(n):
            for opt, body in pairs:
                with module.toggle_optimizer(opt, zero_grad=False, step=False):
                    body()

    iterations = max(1, args.mem_blocks // n_opts)
    # Under tracemalloc torch's zero_grad/step machinery costs ~1 ms a call here, so the 100,000 blocks
    # run with zero_grad=False, step=False (every line of toggleshim's bookkeeping, none of torch's);
    # a tenth as many default blocks (zero_grad + step, empty body) and statement toggles cover the rest;
    # Lightning's manual sequence is the reference for what torch itself allocates and keeps.
    plan = (("block, zero_grad=False, step=False", bare_block, iterations),
            ("block (default: zero_grad + step)", fx.variants["block"], max(1, iterations // 10)),
            ("statement toggle + untoggle", fx.variants["statement"], max(1, iterations // 10)),
            ("reference: manual with Lightning's originals", fx.variants["manual"], max(1, iterations // 10)))
    for _name, run, _count in plan:  # untraced: torch fills its lazy caches (profiler ops) here
        run(2000)
    rows = []
    for name, run, count in plan:
        gc.collect()
        tracemalloc.start()
        try:
            run(1000)  # warm-up, traced so that frees of warm-up objects are accounted too
            gc.collect()
            base, _ = tracemalloc.get_traced_memory()
            before = tracemalloc.take_snapshot()
            tracemalloc.reset_peak()
            t0 = time.perf_counter()
            run(count)
            elapsed = time.perf_counter() - t0
            gc.collect()
            current, peak = tracemalloc.get_traced_memory()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        diff = [d for d in after.compare_to(before, "filename") if d.size_diff]
        by_file = sorted(diff, key=lambda d: -abs(d.size_diff))
        shim = sum(d.size_diff for d in diff if "toggleshim" in d.traceback[0].filename)
        state = _toggle.state_if_any(fx.module)
        rows.append({
            "variant": name, "toggles": count * n_opts, "growth_kib": (current - base) / 1024,
            "toggleshim_growth_kib": shim / 1024,
            "peak_above_base_kib": (peak - base) / 1024, "seconds": elapsed,
            "plans": len(state.plans) if state else 0, "stack": len(state.stack) if state else 0,
            "record_left": len(fx.module.__dict__.get("_param_requires_grad_state") or {}),
            "top_files": [(d.traceback[0].filename, d.size_diff, d.count_diff) for d in by_file[:5]],
        })
    report["memory"] = {"params": args.mem_params, "optimizers": n_opts, "body": "none", "rows": rows}
    lines = [
        f"{args.mem_params:,} params, {n_opts} optimizers, empty body; every variant warmed up untraced "
        "(2,000 iterations), then per variant tracemalloc started before a 1,000-iteration warm-up; growth = "
        "traced memory after the loop and `gc.collect()` minus traced memory after the warm-up; "
        "'in toggleshim' = the part of it allocated by toggleshim's own lines; 'peak' is the transient "
        "maximum, which also counts memory parked in CPython's free lists (a full gc.collect() empties them).",
        "",
        "| variant | toggles | growth KiB | in toggleshim KiB | peak above base KiB | cached plans "
        "| open stack | record left | loop s (traced) |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['toggles']:,} | {r['growth_kib']:.1f} "
                     f"| {r['toggleshim_growth_kib']:.1f} | {r['peak_above_base_kib']:.1f} | {r['plans']} "
                     f"| {r['stack']} | {r['record_left']} | {r['seconds']:.1f} |")
    for r in rows:
        if abs(r["growth_kib"]) >= 1:
            where = ", ".join(f"{f.rsplit('/site-packages/', 1)[-1]} {s / 1024:+.1f} KiB ({c:+d} blocks)"
                              for f, s, c in r["top_files"])
            lines.append(f"\n{r['variant']}: growth by file: {where}")
    return "\n".join(lines)


# -- section: longlived ------------------------------------------------------------------------

@section("longlived", default=False)
def run_longlived(args: argparse.Namespace, report: dict[str, Any]) -> str:
    """A long-lived process: 10,000 LightningOptimizer wrappers and 100 head replacements, retained memory."""
    wrapper_cls = __import__(f"{_FLAVOUR}.core.optimizer", fromlist=["LightningOptimizer"]).LightningOptimizer
    rows = []
    for who in ("toggleshim", "Lightning's own"):
        toggle = (lambda m, o: m.toggle_optimizer(o)) if who == "toggleshim" else ORIGINAL_TOGGLE
        untoggle = (lambda m, o: m.untoggle_optimizer(o)) if who == "toggleshim" else ORIGINAL_UNTOGGLE

        # 1. wrappers: Lightning makes a class for every LightningOptimizer (each fit makes new ones)
        fx = make_fixture(10, 2, "none")
        gc.collect()
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            classes = []
            for _ in range(args.wrappers):
                w = wrapper_cls(fx.opts[0])
                toggle(fx.module, w)
                untoggle(fx.module, w)
                classes.append(weakref.ref(type(w)))
                del w
            gc.collect()
            wrappers_kib = (tracemalloc.get_traced_memory()[0] - base) / 1024
        finally:
            tracemalloc.stop()
        alive_classes = sum(c() is not None for c in classes)

        # 2. model surgery: a 16 MB head replaced again and again, optimizers re-created each time
        module = BenchModule(4)
        head = nn.Linear(2048, 2048)  # 16 MiB of weights
        module.head = head
        others = list(module.params)
        heads = []
        for _ in range(args.replacements):
            module.head = nn.Linear(2048, 2048)
            opts = [torch.optim.SGD(others, lr=LR), torch.optim.SGD(module.head.parameters(), lr=LR)]
            module.trainer = TrainerStandIn(opts)
            for opt in opts:
                toggle(module, opt)
                untoggle(module, opt)
            heads.append(weakref.ref(module.head.weight))
        del head, opts
        alive_now = sum(h() is not None for h in heads)  # before any collection: reference counts alone
        gc.collect()
        alive_after_gc = sum(h() is not None for h in heads)
        rows.append({"who": who, "wrappers": args.wrappers, "wrappers_retained_kib": wrappers_kib,
                     "wrapper_classes_alive": alive_classes, "replacements": args.replacements,
                     "heads_alive": alive_now, "heads_alive_after_gc": alive_after_gc})
    report["longlived"] = rows
    lines = [
        f"{args.wrappers:,} `LightningOptimizer` wrappers, each toggled and untoggled once, then dropped "
        "(traced memory still held after `gc.collect()`); "
        f"{args.replacements} replacements of a 16 MiB head (`nn.Linear(2048, 2048)`), the optimizers "
        "re-created and both toggled after each: old heads still alive (the current one counts 1).",
        "",
        "| toggling | wrappers retained KiB | wrapper classes alive | heads alive | heads alive after gc.collect() |",
        "|:---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['who']} | {r['wrappers_retained_kib']:.1f} | {r['wrapper_classes_alive']} "
                     f"| {r['heads_alive']} | {r['heads_alive_after_gc']} |")
    return "\n".join(lines)


# -- section: weakref -------------------------------------------------------------------------

class _Boom(Exception):
    pass


def _used_toggle(how: str) -> tuple[Any, list[weakref.ref[Any]], dict[str, int]]:
    """A Toggle after one block (``block``), after a block left by an exception (``raised``) or a
    statement toggle never untoggled (``open``, the positive control), and weakrefs to what it touched.
    Every other reference to the fixture dies when this function returns."""
    fx = make_fixture(100, 2, "grad")
    refs: list[weakref.ref[Any]] = [weakref.ref(fx.module), weakref.ref(fx.twin)]
    refs += [weakref.ref(o) for o in fx.opts]
    refs += [weakref.ref(p) for g in fx.groups for p in g]
    t = fx.module.toggle_optimizer(fx.opts[0])
    if how == "block":
        with t:
            fx.bodies[0]()
    elif how == "raised":
        try:
            with t:
                fx.bodies[0]()
                raise _Boom
        except _Boom:
            pass
    kinds = {"module": 2, "optimizer": len(fx.opts), "parameter": fx.n_params}
    return t, refs, kinds


def _alive(refs: list[weakref.ref[Any]], kinds: dict[str, int]) -> dict[str, int]:
    out, i = {}, 0
    for kind, count in kinds.items():
        out[kind] = sum(r() is not None for r in refs[i:i + count])
        i += count
    return out


def _holds(t: Any) -> tuple[dict[str, str], list[str]]:
    """Slots of a Toggle that hold an object (not None, not a flag or its phase, an int), and its
    referents that could hold a parameter."""
    def flags(v: Any) -> bool:  # the block's flags: a dict of bools, nothing of the user's
        return isinstance(v, dict) and all(isinstance(x, bool) for x in v.values())

    slots = {s: getattr(t, s, None) for s in type(t).__slots__}
    held = {k: type(v).__name__ for k, v in slots.items() if v is not None and not isinstance(v, int) and not flags(v)}
    referents = [type(r).__name__ for r in gc.get_referents(t)
                 if isinstance(r, (torch.Tensor, nn.Module, torch.optim.Optimizer, dict, tuple, list)) and not flags(r)]
    return held, referents


@section("weakref")
def run_weakref(args: argparse.Namespace, report: dict[str, Any]) -> str:
    """After a block, the Toggle object keeps no parameter (optimizer, module) alive."""
    cases = {"after block": "block", "after block left by an exception": "raised",
             "control: open statement toggle": "open"}
    results: dict[str, Any] = {}
    verdicts = []
    for case, how in cases.items():
        t, refs, kinds = _used_toggle(how)
        gc.collect()
        alive = _alive(refs, kinds)
        held, referents = _holds(t)
        del t
        gc.collect()
        after_drop = _alive(refs, kinds)
        results[case] = {"alive": alive, "non_none_slots": held, "referents": referents,
                         "alive_after_dropping_toggle": after_drop}
        if how == "open":  # the check must see the references an open toggle does hold
            ok = any(alive.values()) and not any(after_drop.values())
        else:
            ok = not any(alive.values()) and not held and not referents
        verdicts.append(ok)
        results[case]["ok"] = ok
    report["weakref"] = results
    lines = ["Alive after `gc.collect()` while the Toggle object is still referenced (of 2 modules incl. "
             "the twin, 2 optimizers, 100 parameters); non-None slots / container or tensor referents of "
             "the Toggle; alive once the Toggle is dropped too:", "",
             "| case | modules | optimizers | parameters | slots held | referents | alive after drop | ok |",
             "|:---|---:|---:|---:|:---|:---|---:|:---|"]
    for case, r in results.items():
        a = r["alive"]
        lines.append(f"| {case} | {a['module']} | {a['optimizer']} | {a['parameter']} "
                     f"| {', '.join(r['non_none_slots']) or 'none'} | {', '.join(r['referents']) or 'none'} "
                     f"| {sum(r['alive_after_dropping_toggle'].values())} | {'yes' if r['ok'] else 'NO'} |")
    lines += ["", "Verdict: " + ("PASS, the used Toggle keeps nothing alive (and the control shows the "
                                 "check would see it)." if all(verdicts) else "FAIL")]
    return "\n".join(lines)


# -- section: profile (not in the default run) ------------------------------------------------

@section("harness", default=False)
def run_harness(args: argparse.Namespace, report: dict[str, Any]) -> str:
    """Worlds checked per second by the property suite (``pytest property_tests -n auto``), per profile."""
    import os
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    rows = ["| profile | worlds | seconds (wall) | worlds / s | pytest |", "|---|---:|---:|---:|---|"]
    results = {}
    for profile in args.profiles.split(","):
        with tempfile.NamedTemporaryFile("r", suffix=".worlds") as counts:
            env = {**os.environ, "HYPOTHESIS_PROFILE": profile, "TOGGLESHIM_WORLDS_FILE": counts.name}
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "pytest", "property_tests", "-n", "auto", "-q"],
                                  cwd=root, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            worlds = sum(int(line) for line in Path(counts.name).read_text().split())
        last = (proc.stdout.strip().splitlines() or ["?"])[-1]
        results[profile] = {"worlds": worlds, "seconds": wall, "rate": worlds / wall, "pytest": last}
        rows.append(f"| {profile} | {worlds} | {wall:.1f} | {worlds / wall:.1f} | {last} |")
    report["harness"] = results
    return "\n".join(rows)


@section("profile", default=False)
def run_profile(args: argparse.Namespace, report: dict[str, Any]) -> str:
    """cProfile of the block at --profile-params / 2 optimizers (opt-in: --only profile)."""
    n_params, n_opts = args.profile_params, 2
    out = []
    report["profile"] = {}
    for body in (["grad", "none"] if args.body == "both" else [args.body]):
        fx = make_fixture(n_params, n_opts, body)
        run = fx.variants["block"]
        run(20)
        n = _calibrate(run, 2.0 if not args.quick else 0.5, False)
        prof = cProfile.Profile()
        prof.enable()
        run(n)
        prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        total = stats.total_tt  # type: ignore[attr-defined]
        entries = []
        for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            entries.append({"where": f"{filename.rsplit('/', 1)[-1]}:{line}({func})", "file": filename,
                            "calls_per_block": nc / (n * n_opts), "tottime_share": tt / total,
                            "cumtime_share": ct / total})
        entries.sort(key=lambda e: -e["tottime_share"])
        report["profile"][body] = {"blocks": n * n_opts, "entries": entries[:40]}
        out += [f"### cProfile, block, {n_params:,} params / {n_opts} optimizers, body={body} "
                f"({n * n_opts:,} blocks)", "",
                "| function | calls/block | tottime % | cumtime % |", "|:---|---:|---:|---:|"]
        for e in entries[:args.profile_top]:
            out.append(f"| `{e['where']}` | {e['calls_per_block']:.2f} | {100 * e['tottime_share']:.1f} "
                       f"| {100 * e['cumtime_share']:.1f} |")
        core = ("toggleshim/_toggle.py", "toggleshim/_block.py", "toggleshim/_writes.py")
        mine = [e for e in entries if e["file"].replace("\\", "/").endswith(core)]
        out += ["", "toggleshim's core only:", "", "| function | calls/block | tottime % | cumtime % |",
                "|:---|---:|---:|---:|"]
        for e in mine:
            out.append(f"| `{e['where']}` | {e['calls_per_block']:.2f} | {100 * e['tottime_share']:.1f} "
                       f"| {100 * e['cumtime_share']:.1f} |")
        out.append("")
    return "\n".join(out)


# -- main -------------------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "").replace(",", "")) for x in text.split("/") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few rounds, short batches, fewer memory toggles")
    p.add_argument("--only", default=None,
                   help="comma-separated sections to run (default: every default section); see --list")
    p.add_argument("--list", action="store_true", help="list the sections and exit")
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    p.add_argument("--profiles", default="dev,ci", help="Hypothesis profiles for the harness section (dev,ci)")
    p.add_argument("--params", type=_ints, default=[10, 100, 1000, 10000],
                   help="parameter counts, '/'-separated (default 10/100/1000/10000)")
    p.add_argument("--optimizers", type=_ints, default=[2, 4], help="optimizer counts (default 2/4)")
    p.add_argument("--body", choices=["grad", "none", "both"], default="both",
                   help="grad: set .grad on every toggled parameter so SGD steps for real; none: empty "
                        "body (default both)")
    p.add_argument("--rounds", type=int, default=None, help="at most this many rounds per row (75; quick 7)")
    p.add_argument("--min-rounds", type=int, default=None, help="at least this many rounds (11; quick 5)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="clock seconds per row that decide the rounds between the bounds (3; quick 0.5)")
    p.add_argument("--batch-ms", type=float, default=None, help="target ms per timed batch (10; quick 3)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                   help="cpu: process CPU time (default); wall: perf_counter")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--gc", action="store_true", help="keep the cyclic GC enabled while timing")
    p.add_argument("--mem-blocks", type=int, default=None, help="blocks traced (100,000; quick 10,000)")
    p.add_argument("--wrappers", type=int, default=10000, help="LightningOptimizer wrappers in longlived")
    p.add_argument("--replacements", type=int, default=100, help="head replacements in longlived")
    p.add_argument("--mem-params", type=int, default=100, help="parameters in the memory check (100)")
    p.add_argument("--profile-params", type=int, default=1000, help="parameters in the profile (1000)")
    p.add_argument("--profile-top", type=int, default=15, help="rows of the overall profile table")
    p.add_argument("--runs", type=int, default=1,
                   help="ratios: this many independent runs, each in a fresh process; the result of a row "
                        "is the median of its runs' ratios (default 1)")
    p.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (7 if args.quick else 75)
    args.min_rounds = min(args.rounds, args.min_rounds or (5 if args.quick else 11))
    args.budget_s = args.budget_s or (0.5 if args.quick else 3.0)
    args.batch_ms = args.batch_ms or (3.0 if args.quick else 10.0)
    args.mem_blocks = args.mem_blocks or (10_000 if args.quick else 100_000)
    if args.only:
        chosen = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in chosen if s not in SECTIONS]
        if unknown:
            p.error(f"unknown section(s) {unknown}; choose from {sorted(SECTIONS)}")
        args.sections = chosen
    else:
        args.sections = [name for name, s in SECTIONS.items() if s.default]
    return args


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__, "lightning": version("lightning"),
            "pytorch_lightning": version("pytorch-lightning"), "toggleshim": toggleshim.__version__,
            "flavour": _FLAVOUR, "toggled_optimizer": HAS_TOGGLED,
            "torch_threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for s in SECTIONS.values():
            print(f"{s.name:<10} {'(default)' if s.default else '(opt-in) '} {s.help}")
        return 0
    global _clock
    _clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    # Everything imported so far (torch, lightning: ~300k objects) leaves the collector's view, so
    # gc.collect() between configurations takes milliseconds instead of ~0.3 s.
    gc.collect()
    gc.freeze()
    env = environment()
    report: dict[str, Any] = {"environment": env, "arguments": {
        k: v for k, v in vars(args).items() if k not in ("list",)}}
    started = time.perf_counter()
    print("# toggleshim toggle benchmark\n")
    print(f"Python {env['python']}, torch {env['torch']}, lightning {env['lightning']}, "
          f"toggleshim {env['toggleshim']} ({env['flavour']}), "
          f"torch threads {env['torch_threads']}.")
    command = " ".join(["python benchmarks/bench_toggle.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"Command: `{command}`\n")
    for name in args.sections:
        s = SECTIONS[name]
        t0 = time.perf_counter()
        if args.verbose:
            print(f"[{name}] ...", file=sys.stderr, flush=True)
        text = s.run(args, report)
        print(f"## {name}: {s.help}\n\n{text}\n\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
    report["total_s"] = time.perf_counter() - started
    print(f"Total {report['total_s']:.0f} s.")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
