#!/usr/bin/env python
"""Where the time goes at 10 parameters (issue "Performance": block/manual is at parity there).

Run from the repository root::

    python benchmarks/small_models.py            # 10 parameters, 2 optimizers, body none
    python benchmarks/small_models.py --body grad --rounds 61

Same fixture as ``bench_toggle.py`` (its ``make_fixture``), same method (variants interleaved in
shuffled rounds, process CPU clock, cyclic GC off, median per variant, µs per toggled optimizer).
Variants:

* ``bare block``      ``with module.toggle_optimizer(opt, zero_grad=False, step=False): pass``
* ``lightning pair``  Lightning's original ``toggle_optimizer`` + ``untoggle_optimizer``
* ``zero_grad+step``  ``opt.zero_grad(); body(); opt.step()`` alone
* ``block``           the full block (toggle, zero_grad, body, step, untoggle)
* ``manual``          Lightning's manual sequence
* ``essential``       only the torch work any exact toggle does: read every ``requires_grad``, freeze
                      the other optimizers' parameters, give them their values back (True: every
                      parameter of the fixture is trainable; no checks, no record, no context manager)
* ``essential+step``  the same around ``opt.zero_grad(); body(); opt.step()``: the floor in place
* ``minimal block``   the least any block can do on Lightning's own functions: a class whose
                      ``__init__`` calls Lightning's toggle, ``__enter__`` zero_grad, ``__exit__`` step
                      (clean exit) and Lightning's untoggle in a ``finally``: no checks, no nesting,
                      no guard
* ``block, no guard`` toggleshim's block with ``__exit__`` the plain method (no exit guard, so not
                      safe against a Ctrl-C on its first line): what the guard costs
* ``block, unchecked exit``  toggleshim's block whose flat exit restores from the plan without
                      reading ``trainer.optimizers`` and the record again (not exact if the body
                      edits them): what the exit's checks cost

It prints each variant's time and the two numbers that explain the parity: what toggling costs
alone (bare block / lightning pair) and what it costs *in place*, beside ``zero_grad`` and ``step``
(block - zero_grad+step against manual - zero_grad+step): ``zero_grad`` and ``step`` run slower
right after other Python work than back to back, so a toggle's share of a small step is larger
than its own time.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_toggle as bench

from toggleshim import _block, _toggle, _writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=10)
    parser.add_argument("--optimizers", type=int, default=2)
    parser.add_argument("--body", choices=["none", "grad"], default="none")
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--iterations", type=int, default=300, help="iterations per batch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fx = bench.make_fixture(args.params, args.optimizers, args.body)
    module = fx.module
    pairs = list(zip(fx.opts, fx.bodies, strict=True))
    toggle, untoggle = bench.ORIGINAL_TOGGLE, bench.ORIGINAL_UNTOGGLE

    def bare_block(n: int) -> None:
        for _ in range(n):
            for opt, _body in pairs:
                with module.toggle_optimizer(opt, zero_grad=False, step=False):
                    pass

    def lightning_pair(n: int) -> None:
        for _ in range(n):
            for opt, _body in pairs:
                toggle(module, opt)
                untoggle(module, opt)

    def zero_grad_step(n: int) -> None:
        for _ in range(n):
            for opt, body in pairs:
                opt.zero_grad()
                body()
                opt.step()

    every = [p for group in fx.groups for p in group]
    others = [[p for group, o in zip(fx.groups, fx.opts, strict=True) if o is not opt for p in group]
              for opt in fx.opts]
    triples = list(zip(fx.opts, fx.bodies, others, strict=True))
    requires_grad = attrgetter("requires_grad")

    def essential(n: int) -> None:
        for _ in range(n):
            for _opt, _body, frozen in triples:
                vals = tuple(map(requires_grad, every))
                for p in frozen:
                    p.requires_grad = False
                for p in frozen:
                    p.requires_grad = True
        assert vals  # the values were read

    def essential_step(n: int) -> None:
        for _ in range(n):
            for opt, body, frozen in triples:
                vals = tuple(map(requires_grad, every))
                for p in frozen:
                    p.requires_grad = False
                opt.zero_grad()
                body()
                opt.step()
                for p in frozen:
                    p.requires_grad = True
        assert vals

    class Minimal:
        __slots__ = ("opt",)

        def __init__(self, opt: torch.optim.Optimizer) -> None:
            self.opt = opt
            toggle(module, opt)

        def __enter__(self) -> torch.optim.Optimizer:
            self.opt.zero_grad()
            return self.opt

        def __exit__(self, exc_type: Any, *exc: Any) -> bool:
            try:
                if exc_type is None:
                    self.opt.step()
            finally:
                untoggle(module, self.opt)
            return False

    def minimal_block(n: int) -> None:
        for _ in range(n):
            for opt, body in pairs:
                with Minimal(opt):
                    body()

    toggle_cls, flat_cls = _block.Toggle, _toggle._Flat
    guarded, checked = toggle_cls.__dict__["__exit__"], flat_cls.undo

    def unchecked(self: Any) -> None:
        picks = self.plan.restore
        _writes.restore(picks(self.managed), picks(self.vals))
        self.forget()
        self.module.__dict__["_param_requires_grad_state"] = {}

    def patched(exit_fn: Any, flat: Any) -> Callable[[int], None]:
        def run(n: int) -> None:
            toggle_cls.__exit__, flat_cls.undo = exit_fn, flat  # type: ignore[method-assign]
            try:
                fx.variants["block"](n)
            finally:
                toggle_cls.__exit__, flat_cls.undo = guarded, checked  # type: ignore[method-assign]
        return run

    variants: dict[str, Callable[[int], None]] = {
        "bare block": bare_block,
        "lightning pair": lightning_pair,
        "zero_grad+step": zero_grad_step,
        "block": fx.variants["block"],
        "manual": fx.variants["manual"],
        "essential": essential,
        "essential+step": essential_step,
        "minimal block": minimal_block,
        "block, no guard": patched(toggle_cls._exit, checked),
        "block, unchecked exit": patched(guarded, unchecked),
    }
    rng = random.Random(0)
    order = list(variants.items())
    times: dict[str, list[float]] = {name: [] for name in variants}
    per = args.iterations * len(pairs)
    gc.disable()
    try:
        for run in variants.values():
            run(20)  # warm-up
        for _ in range(args.rounds):
            rng.shuffle(order)
            for name, run in order:
                t0 = time.process_time_ns()
                run(args.iterations)
                times[name].append((time.process_time_ns() - t0) / per / 1e3)
    finally:
        gc.enable()
    med = {name: statistics.median(values) for name, values in times.items()}
    low = {name: sorted(values)[len(values) // 10] for name, values in times.items()}
    print(f"{args.params} parameters, {args.optimizers} optimizers, body {args.body}, {args.rounds} rounds "
          f"of {args.iterations} iterations; µs per toggled optimizer: median, and the 10th percentile "
          "(the least disturbed rounds); the ratios to manual of each")
    print("| variant | µs (median) | µs (p10) | /manual (median) | /manual (p10) |\n|:---|---:|---:|---:|---:|")
    for name, value in med.items():
        print(f"| {name} | {value:.1f} | {low[name]:.1f} | {value / med['manual']:.3f} "
              f"| {low[name] / low['manual']:.3f} |")
    alone = med["bare block"] / med["lightning pair"]
    ours = med["block"] - med["zero_grad+step"]
    theirs = med["manual"] - med["zero_grad+step"]
    print(f"\ntoggling alone: bare block / lightning pair = {alone:.2f}")
    print(f"toggling in place: (block - zero_grad+step) = {ours:.1f} µs, (manual - zero_grad+step) = "
          f"{theirs:.1f} µs, ratio {ours / theirs:.2f}; block/manual = {med['block'] / med['manual']:.2f}")
    floor = med["essential+step"] - med["zero_grad+step"]
    print(f"an exact toggle's own torch work: {med['essential']:.1f} µs alone, {floor:.1f} µs in place "
          f"(block/manual {med['essential+step'] / med['manual']:.2f} if that were all a toggle did)")


if __name__ == "__main__":
    main()
