"""scripts/standard_mutation.py splits and samples the mutants by the mutants themselves: two runs of
``--shard 0/2`` and ``--shard 1/2`` are two cosmic-ray sessions, each drawing its own random job ids,
and must still share the mutants out exactly (once each, none left out)."""

from __future__ import annotations

import random
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from standard_mutation import _in_order  # type: ignore[import-not-found]

MUTANTS = [(row, col, op, occ) for row in (3, 17, 40) for col in (4, 12) for op in ("core/AddNot", "core/Eq_Is")
           for occ in (0, 1)]


def _session(seed: int) -> list[Any]:
    """The same mutants as one ``cosmic-ray init`` makes them: fresh random job ids, in any order."""
    items = [SimpleNamespace(job_id=uuid.UUID(int=random.Random(seed * 1000 + i).getrandbits(128)).hex,
                             mutations=[SimpleNamespace(module_path=Path("toggleshim/_toggle.py"), start_pos=(row, col),
                                                        operator_name=op, occurrence=occ)])
             for i, (row, col, op, occ) in enumerate(MUTANTS)]
    random.Random(seed).shuffle(items)
    return items


def _mutant(items: list[Any], job_id: str) -> tuple[int, int, str, int]:
    (m,) = next(item for item in items if item.job_id == job_id).mutations
    return m.start_pos[0], m.start_pos[1], m.operator_name, m.occurrence


def test_two_sessions_split_the_same_mutants_into_disjoint_shares() -> None:
    first, second = _session(1), _session(2)
    assert {i.job_id for i in first}.isdisjoint({i.job_id for i in second})  # as two real sessions
    share0 = {_mutant(first, j) for j in _in_order(first)[0::2]}
    share1 = {_mutant(second, j) for j in _in_order(second)[1::2]}
    assert share0.isdisjoint(share1)
    assert share0 | share1 == set(MUTANTS)


def test_the_order_is_the_mutants_not_the_job_ids() -> None:
    orders = [[_mutant(items, j) for j in _in_order(items)] for items in (_session(3), _session(4), _session(5))]
    assert orders[0] == orders[1] == orders[2] == sorted(MUTANTS)
