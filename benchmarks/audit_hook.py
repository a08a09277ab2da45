"""What toggleshim's audit hook costs each audit event of the process (docs/performance.md).

``import toggleshim`` adds one audit hook (``sys.addaudithook``: the backstop that patches a Lightning
imported behind another import hook; it cannot be removed). CPython calls it for every audit event:
``open``, ``sys._getframe``, ``exec``, ``import``... This times the same events in one fresh process
before and after ``import toggleshim`` (nothing else adds an audit hook here), on the process's CPU
clock, the median of rounds:

    python benchmarks/audit_hook.py [--calls 200000] [--rounds 7]
    python benchmarks/audit_hook.py --reference   # a no-op Python audit hook instead: what any hook costs
    python benchmarks/audit_hook.py --fit         # how many audit events a batch of a manual-optimization fit raises

Rows: a non-import event (``sys.audit`` with another name: the hook's first line returns), a real
``sys._getframe()`` call, and an "import" event with both flavours imported and judged (the hook's
whole check), also after ``uninstall()``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable


def _per_call_ns(fn: Callable[[], object], calls: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.process_time_ns()
        for _ in range(calls):
            fn()
        times.append((time.process_time_ns() - start) / calls)
    return statistics.median(times)


def _count_fit_events() -> None:
    """Audit events per batch of a real ``Trainer.fit`` (two heads, manual optimization, a block per
    optimizer; 3 epochs of 100 batches after a warm-up epoch), by event."""
    import collections

    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import toggleshim  # noqa: F401 - the blocks below are toggleshim's

    class TwoHeads(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.a, self.b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)

        def configure_optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
            return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            opt_a, opt_b = self.optimizers()  # type: ignore[misc]
            (x,) = batch
            with self.toggle_optimizer(opt_a):  # type: ignore[attr-defined]
                self.manual_backward((self.a(x) + self.b(x)).pow(2).mean())
            with self.toggle_optimizer(opt_b):  # type: ignore[attr-defined]
                self.manual_backward((self.a(x) - self.b(x)).pow(2).mean())

    counts: collections.Counter[str] = collections.Counter()
    on = [False]

    def counting(event: str, args: tuple[object, ...]) -> None:
        if on[0]:
            counts[event] += 1

    sys.addaudithook(counting)
    data = DataLoader(TensorDataset(torch.randn(400, 2, generator=torch.Generator().manual_seed(0))), batch_size=4)
    for epochs, counted in ((1, False), (3, True)):
        trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        on[0] = counted
        start = time.process_time()
        trainer.fit(TwoHeads(), data)
        on[0] = False
    batches = 3 * len(data)
    cpu = time.process_time() - start
    print(f"{batches} batches, {sum(counts.values()):,} audit events ({sum(counts.values()) / batches:.1f} a batch), "
          f"{cpu / batches * 1e3:.2f} ms CPU a batch; by event: {dict(counts.most_common())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reference", action="store_true", help="add a no-op audit hook, not toggleshim's")
    parser.add_argument("--fit", action="store_true", help="count the audit events of a Trainer.fit instead")
    args = parser.parse_args()
    if args.fit:
        _count_fit_events()
        return
    modules = sys.modules
    path, meta, hooks = sys.path, sys.meta_path, sys.path_hooks
    events: dict[str, Callable[[], object]] = {
        "other event (sys.audit('bench.other'))": lambda: sys.audit("bench.other", 1),
        "sys._getframe() (a real audited call)": sys._getframe,
        "'import' event, flavours judged": lambda: sys.audit("import", "bench_mod", None, path, meta, hooks),
    }
    import lightning.pytorch  # noqa: F401 - both flavours imported first, as in a training script
    import pytorch_lightning  # noqa: F401

    before = {name: _per_call_ns(fn, args.calls, args.rounds) for name, fn in events.items()}
    if args.reference:
        sys.addaudithook(lambda event, hook_args: None)
    else:
        import toggleshim

        assert toggleshim.is_installed() and "toggleshim._patch" in modules
    after = {name: _per_call_ns(fn, args.calls, args.rounds) for name, fn in events.items()}
    if not args.reference:
        toggleshim.uninstall()
    uninstalled = {name: _per_call_ns(fn, args.calls, args.rounds) for name, fn in events.items()}
    print(f"Python {sys.version.split()[0]}, {args.rounds} rounds of {args.calls:,} calls, median ns per call")
    hook = "a no-op audit hook" if args.reference else "import toggleshim"
    print(f"| event | before {hook} | after | added | after uninstall() |")
    print("|:---|---:|---:|---:|---:|")
    for name in events:
        print(f"| {name} | {before[name]:.0f} | {after[name]:.0f} | {after[name] - before[name]:+.0f} | "
              f"{uninstalled[name]:.0f} |")


if __name__ == "__main__":
    main()
