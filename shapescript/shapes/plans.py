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


# -- `layout auto`: what each layout costs, and the compiler's choice (plan/choose.py) ---------------

@dataclass(frozen=True)
class Footprint:
    """What one device holds for a step, in bytes: the params (and buffers) of the models the program
    uses, the optimizer's state and the gradients of those it trains, and an estimate of the step's
    activations (every value its differentiated functions work out, as autograd keeps them)."""

    params: int
    optimizer: int
    gradients: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.optimizer + self.gradients + self.activations


@dataclass(frozen=True)
class LayoutCost:
    """One layout `layout auto` weighed: its options (`shard_params`, `split` of a DeviceSet, as
    `layout` says them), what a step sends (bytes, from one device) and holds per device; or, for a
    layout the compiler refuses for this program, why (`refused`: its first error, "E1801: ...")."""

    layout: str  # "data parallel", "shard params", "split H", "split H + shard params"
    shard_params: bool
    split: str | None
    sent: int = 0
    footprint: Footprint | None = None
    refused: str | None = None

    @property
    def held(self) -> int:
        """The bytes each device holds (0 for a refused layout)."""
        return self.footprint.total if self.footprint is not None else 0

    def fits(self, budget: int | None) -> bool:
        return self.refused is None and (budget is None or self.held <= budget)


@dataclass(frozen=True)
class LayoutChoice:
    """`layout auto`'s choice: every layout weighed, in the order of preference for a tie (the
    simplest first), the one chosen, the budget each device had (None: not known, so the fewest
    bytes sent chose), where the budget came from, the step costed and the batch size counted."""

    chosen: LayoutCost
    costs: tuple[LayoutCost, ...]
    budget: int | None
    budget_from: str  # "`memory 40 GiB`", "this machine's memory, 24 GiB over 3 devices", ...
    step: str | None  # the function whose step is costed (one that updates a model)
    batch: int  # the batch size the sizes are worked out at
    batch_from: str  # "`batches(32)` at gpt.ss:73:39", or why 1

    def runners_up(self) -> tuple[LayoutCost, ...]:
        """The other layouts that fit, fewest bytes sent first."""
        others = [c for c in self.costs if c is not self.chosen and c.fits(self.budget)]
        return tuple(sorted(others, key=lambda c: (c.sent, c.held)))
