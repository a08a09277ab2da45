"""Threads, each with its own module, entering blocks every way at once: each module ends exactly as
it does alone (issue 35: a class-level ``__exit__`` lookup shared by the threads once took another
thread's exit watch, or failed with ``IndexError``).

Hypothesis draws, per thread, a sequence of blocks (optimizer, flags, the entry point: the method,
``toggleshim.toggle``, ``Toggle(...)``; the way in: a ``with`` statement, ``contextlib.ExitStack``,
explicit ``__enter__``/``__exit__``; nested or not). The threads run their sequences many times over
with the interpreter switching threads as often as it can; every body checks that only its block's
optimizer trains, and at the end each module's ``requires_grad``, parameters and optimizer state
equal those of the same sequence run alone, in this thread. Stand-in trainers (the threads share no
Trainer); the same runs under a real ``Trainer.fit`` are in tests/test_training.py.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from _fixtures import state, three_heads
from hypothesis import given, settings
from hypothesis import strategies as st

import toggleshim

ENTRIES = ("method", "toggle", "Toggle")
WAYS = ("with", "ExitStack", "explicit")


@dataclass(frozen=True)
class _Op:
    k: int  # the optimizer
    entry: str
    way: str
    zero_grad: bool
    step: bool
    inner: tuple[_Op, ...] = ()  # blocks nested in this one


def _ops(depth: int) -> st.SearchStrategy[_Op]:
    inner = st.lists(_ops(depth - 1), max_size=1).map(tuple) if depth else st.just(())
    ops = st.builds(_Op, st.integers(0, 2), st.sampled_from(ENTRIES), st.sampled_from(WAYS), st.booleans(),
                    st.booleans(), inner)
    # a block over the optimizer of the block around it would step inside it: a double step, refused
    return ops.filter(lambda op: all(i.k != op.k for i in op.inner))


# per thread: up to three blocks, one level of nesting (two threads: what toggleshim shares between
# threads is the same for two as for more)
SEQUENCES = st.lists(_ops(1), min_size=1, max_size=3).map(tuple)


@contextlib.contextmanager
def _block(m: Any, op: _Op) -> Iterator[None]:
    opt = m.opts[op.k]
    flags = {"zero_grad": op.zero_grad, "step": op.step}
    made = (m.toggle_optimizer(opt, **flags) if op.entry == "method" else
            toggleshim.toggle(m, opt, **flags) if op.entry == "toggle" else toggleshim.Toggle(m, opt, **flags))
    if op.way == "with":
        with made:
            yield
    elif op.way == "ExitStack":
        with contextlib.ExitStack() as stack:
            stack.enter_context(made)
            yield
    else:
        made.__enter__()
        try:
            yield
        except BaseException as e:
            made.__exit__(type(e), e, e.__traceback__)
            raise
        made.__exit__(None, None, None)


def _run(m: Any, ops: tuple[_Op, ...], x: torch.Tensor, seen: list[str]) -> None:
    for op in ops:
        with _block(m, op):
            heads = (m.a, m.b, m.c)
            trainable = [p.requires_grad for h in heads for p in h.parameters()]
            own = [p.requires_grad for p in heads[op.k].parameters()]
            if any(trainable) and not (all(own) and sum(trainable) == len(own)):
                seen.append(f"inside the block over {op.k}: {trainable}")
            heads[op.k](x).sum().backward()
            _run(m, op.inner, x, seen)


def _snapshot(m: Any) -> tuple[Any, ...]:
    return (state(m), [p.detach().clone() for p in m.parameters()],
            [o.state_dict()["state"] for o in m.opts])


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    same_state = a[0] == b[0] and all(torch.equal(p, q) for p, q in zip(a[1], b[1]))
    buffers = [(k, torch.equal(v["momentum_buffer"], b[2][i][k]["momentum_buffer"]))
               for i, s in enumerate(a[2]) for k, v in s.items()]
    return same_state and len(a[2]) == len(b[2]) and all(ok for _, ok in buffers)


ROUNDS = 30  # each thread runs its sequence this many times: many switches land inside toggleshim


@settings(max_examples=10)  # each example runs two threads ROUNDS times (seconds)
@given(first=SEQUENCES, second=SEQUENCES)
def test_threads_with_their_own_modules_train_as_alone(flavour: str, first: tuple[_Op, ...],
                                                       second: tuple[_Op, ...]) -> None:
    x = torch.ones(1, 2)
    alone = []
    for ops in (first, second):
        m = three_heads(flavour, n_opt=3)
        for _ in range(ROUNDS):
            _run(m, ops, x, [])
        alone.append(_snapshot(m))

    modules = [three_heads(flavour, n_opt=3), three_heads(flavour, n_opt=3)]
    seen: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(m: Any, ops: tuple[_Op, ...]) -> None:
        try:
            start.wait()
            for _ in range(ROUNDS):
                _run(m, ops, x, seen)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=work, args=(m, ops)) for m, ops in zip(modules, (first, second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and seen == []
    for m, expected in zip(modules, alone):
        assert _same(_snapshot(m), expected)
        assert all(state(m).values())  # nothing left frozen
