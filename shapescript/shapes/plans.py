"""What the plans decide about a function on several devices, as every stage after them reads it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Where(enum.StrEnum):
    """Where a function runs (plan/placement.py decides): in the controller, on the workers (every
    device), or anywhere (it touches no device value, so wherever its caller runs)."""

    CONTROLLER = "controller"
    WORKERS = "workers"
    ANYWHERE = "anywhere"


@dataclass(frozen=True)
class Placement:
    """Where a function runs (plan/placement.py), and why, in the manual's words."""
    where: Where
    reason: str = ""


ANYWHERE = Placement(Where.ANYWHERE)


class Combine(enum.StrEnum):
    """How an operation across the batch axis combines every device's part, on several devices (the
    batch split marks it, ops/table.py's `Across.kind` says which for each op): PARTIAL, each
    device's result is a partial sum of the whole, and an all-reduce of the result adds them up
    (sum, `@`, einsum); OWN, the op has a lowering of its own for several devices, which sends what
    it needs (mean its sums and a count, cross_entropy its loss's sum and count)."""

    PARTIAL = "partial"
    OWN = "own"


class HeadsKind(enum.StrEnum):
    """With `split H`: what an op does with values split along H, by its layout rule (ops/table.py),
    and so what plan/layout.py marks on a value. An op's devices work on their parts alone (LOCAL),
    or its results are partial sums that every device's add up to the whole (SUM: the value is
    summed), or it needs its split operands whole (GATHER: the operand is gathered). CUT marks a
    value computed whole, of which each device keeps its part. DTensor's Shard, Partial and
    Replicate are the same ideas."""

    LOCAL = "local"
    SUM = "sum"
    GATHER = "gather"
    CUT = "cut"


@dataclass(frozen=True)
class BatchSplit:
    """How a function on the workers takes the batch (plan/split.py): which generic dims are split
    across the devices, and the split axis of each parameter and of the result (None: whole).
    `heads`: split along a dim of `split H` (plan/layout.py) rather than along the batch axis."""
    dims: frozenset[Any]
    params: tuple[int | None, ...]
    result: int | None
    heads: bool = False
