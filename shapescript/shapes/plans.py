"""What the plans decide about a function on several devices, as every stage after them reads it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Where(enum.StrEnum):
    """Where a function runs (check/placement.py decides): in the controller, on the workers (every
    device), or anywhere (it touches no device value, so wherever its caller runs)."""

    CONTROLLER = "controller"
    WORKERS = "workers"
    ANYWHERE = "anywhere"


@dataclass(frozen=True)
class BatchSplit:
    """How a function on the workers takes the batch (check/split.py): which generic dims are split
    across the devices, and the split axis of each parameter and of the result (None: whole).
    `heads`: split along a dim of `split H` (check/layout.py) rather than along the batch axis."""
    dims: frozenset[Any]
    params: tuple[int | None, ...]
    result: int | None
    heads: bool = False
